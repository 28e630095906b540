"""Plausible bugs, one per entry, that the fast suite (``-m "not e2e"``) must catch.

Each :class:`Mutation` replaces one exact piece of text in one file of a temporary copy of
the repository (``scripts/mutation_harness.py`` applies it; the worktree is never touched).
``original`` must occur exactly once in ``file`` (tests/test_mutations.py checks that every
entry still applies). ``tests`` are the test files (or node ids) that should kill it, so one
mutation costs seconds; ``--all-tests`` runs the whole fast suite instead.

To add one (a new method, say): append an entry to ``MUTATIONS``, run
``.venv/bin/python scripts/mutation_harness.py --only NAME``; the table in
docs/reliability.md gets its row.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Mutation:
    name: str
    area: str
    bug: str            # the plausible bug, in words
    file: str           # relative to the repository root
    original: str       # exact text, present once in ``file``
    replacement: str
    tests: tuple[str, ...]


OBJ = ("tests/test_objectives.py",)
BASELINES = ("tests/test_objectives.py", "tests/test_baselines.py")  # FedProx and MOON act beyond the logits
AGG = ("tests/test_aggregation.py", "tests/test_strategy.py")
AGG_PROPS = ("tests/test_properties_aggregation.py",)
PART = ("tests/test_partition.py",)
PART_PROPS = ("tests/test_properties_partition.py",)
STRAT = ("tests/test_strategy.py",)
SAMPLE = ("tests/test_properties_sampling.py",)
PRESET_PROPS = ("tests/test_properties_presets.py",)
TABLE_PROPS = ("tests/test_properties_tables.py",)
INVARIANTS = ("tests/test_invariants_training.py",)
RESUME = ("tests/test_resume.py", "tests/test_server_optim.py")
FENCE = ("tests/test_deploy_tools.py",)
CONCAT = ("tests/test_fedconcat.py",)
CONCAT_PROPS = ("tests/test_properties_fedconcat.py",)
GF = ("tests/test_fedgf.py",)
DIFF = ("tests/test_differential.py",)  # the app against the plain reference loop, every part
REPLIES = ("tests/test_reply_contents.py",)
AUGMENT_PROPS = ("tests/test_properties_augment.py",)

MUTATIONS: list[Mutation] = [
    # ---- objectives
    Mutation("fedvls-cal-without-prior", "objectives", "FedVLS's calibrated CE forgets the log-prior shift",
             "fedvls_flwr/algorithms/objectives/fedvls.py",
             "            self.cal_bias = log_prior_eps\n",
             "            self.cal_bias = torch.zeros_like(log_prior_eps)\n", OBJ),
    Mutation("fedvls-dis-without-lambda", "objectives", "FedVLS's vacant-class distillation ignores lambda-dis",
             "fedvls_flwr/algorithms/objectives/fedvls.py",
             "scale = self.lambda_dis / B", "scale = 1.0 / B", OBJ),
    Mutation("fedvls-logit-log-b", "objectives", "FedVLS's bounded logit term subtracts log(B+1) for log(B)",
             "fedvls_flwr/algorithms/objectives/fedvls.py",
             "self.prior_mass * math.log(B)", "self.prior_mass * math.log(B + 1)", OBJ),
    Mutation("fedprox-no-half", "objectives", "FedProx's proximal term without the 1/2",
             "fedvls_flwr/algorithms/objectives/baselines.py",
             "value = 0.5 * self.mu * torch.stack", "value = self.mu * torch.stack", BASELINES),
    Mutation("fedrs-alpha-ignored", "objectives", "FedRS leaves the absent classes' logits unscaled",
             "fedvls_flwr/algorithms/objectives/baselines.py",
             "counts.new_full((), alpha)", "counts.new_ones(())", OBJ),
    Mutation("fedlc-margin-power", "objectives", "FedLC's margin uses n^(-1/2) for n^(-1/4)",
             "fedvls_flwr/algorithms/objectives/baselines.py",
             "n.pow(-0.25)", "n.pow(-0.5)", OBJ),
    # ---- aggregation
    Mutation("average-unweighted", "aggregation", "the average ignores each client's number of examples",
             "fedvls_flwr/algorithms/aggregation.py",
             "weights = [r.num_examples / total for r in replies]", "weights = [1.0 / len(replies) for r in replies]", AGG),
    Mutation("integer-buffers-floored", "aggregation", "integer buffers are floored instead of rounded",
             "fedvls_flwr/algorithms/aggregation.py",
             "np.rint(sums[key], out=sums[key])", "np.floor(sums[key], out=sums[key])", AGG),
    Mutation("batchnorm-buffer-1d", "aggregation", "a 0-d buffer (num_batches_tracked) comes out with shape (1,)",
             "fedvls_flwr/algorithms/aggregation.py",
             "out[key] = sums[key].reshape(ref.shape)", "out[key] = sums[key].reshape(ref.shape or (1,))",
             (*AGG, "tests/test_batchnorm.py")),
    Mutation("broadcast-0d-as-1d", "aggregation", "the broadcast record turns 0-d arrays into shape (1,)",
             "fedvls_flwr/app/messages.py",
             'np.require(value, requirements="C")', "np.ascontiguousarray(value)",
             ("tests/test_batchnorm.py", *STRAT)),
    Mutation("server-optimizer-touches-integers", "aggregation", "FedAdam steps integer buffers like weights",
             "fedvls_flwr/algorithms/server_optim.py",
             'return [k for k, v in arrays.items() if v.dtype.kind == "f"]', "return list(arrays)",
             ("tests/test_server_optim.py", "tests/test_batchnorm.py")),
    Mutation("integer-rounding-signed-only", "aggregation",
             "only signed integer buffers are rounded; unsigned and boolean ones are truncated by the cast",
             "fedvls_flwr/algorithms/aggregation.py", 'if ref.dtype.kind in "iub":', 'if ref.dtype.kind == "i":',
             AGG_PROPS),
    Mutation("average-in-array-dtype", "aggregation",
             "each weighted term is computed in the array's dtype (float32), not float64",
             "fedvls_flwr/algorithms/aggregation.py", "block, term = sums[key][lo:hi], np.empty(hi - lo, dtype=np.float64)",
             "block, term = sums[key][lo:hi], np.empty(hi - lo, dtype=np.float32)", AGG_PROPS),
    # ---- reply checks
    Mutation("nan-accepted", "reply checks", "a reply with NaN weights is averaged in",
             "fedvls_flwr/algorithms/aggregation.py",
             '    if (bad := _first_not_finite(floats)) is not None:',
             '    if (bad := _first_not_finite(floats)) and False:', AGG),
    Mutation("shape-unchecked", "reply checks", "a reply with a wrongly shaped array is not refused",
             "fedvls_flwr/algorithms/aggregation.py",
             "if arr.shape != ref.shape:", "if arr.shape != ref.shape and False:", AGG),
    Mutation("zero-examples-accepted", "reply checks", "a reply claiming 0 examples is accepted",
             "fedvls_flwr/algorithms/aggregation.py",
             "reply.num_examples > 0)", "reply.num_examples >= 0)", AGG),
    Mutation("dtype-unchecked", "reply checks", "a reply with another dtype is not refused",
             "fedvls_flwr/algorithms/aggregation.py",
             "if arr.dtype != ref.dtype:", "if arr.dtype != ref.dtype and False:", AGG),
    Mutation("nan-checked-in-float32-only", "reply checks", "NaN and inf are looked for in float32 arrays only",
             "fedvls_flwr/algorithms/aggregation.py",
             '        if arr.dtype.kind in "fc":\n            floats[key]',
             '        if arr.dtype == np.float32:\n            floats[key]', AGG_PROPS),
    Mutation("infinite-count-accepted", "reply checks", "a reply claiming infinitely many examples is accepted",
             "fedvls_flwr/algorithms/aggregation.py",
             "if not (np.isfinite(reply.num_examples) and reply.num_examples > 0):",
             "if not reply.num_examples > 0:", AGG_PROPS),
    # ---- partitioning
    Mutation("dirichlet-no-cap", "partitioning", "Dirichlet keeps giving to clients at N/num-clients (NIID-Bench cap)",
             "fedvls_flwr/data/partition.py", "p = p * (sizes < cap)", "p = p * (sizes < np.inf)", PART),
    Mutation("dirichlet-min-size-ignored", "partitioning", "Dirichlet accepts a split with clients below min_size",
             "fedvls_flwr/data/partition.py", "if smallest >= min_size:", "if smallest >= 0:", PART),
    Mutation("shards-unsorted", "partitioning", "shards are cut from unsorted labels (no label skew)",
             "fedvls_flwr/data/partition.py", 'order = np.argsort(y, kind="stable")', "order = np.arange(y.size)", PART),
    Mutation("shards-unstable-sort", "partitioning",
             "shards are cut from an unstable label sort (within a class, the pool order is not kept)",
             "fedvls_flwr/data/partition.py", 'order = np.argsort(y, kind="stable")',
             'order = np.argsort(y, kind="quicksort")', PART_PROPS),
    Mutation("labeldir-wide-draw", "partitioning",
             "noniid-labeldir draws holder sizes up to n_c for every dataset, not n_c / k beyond 10 classes",
             "fedvls_flwr/data/partition.py", "int(idx.size if num_classes <= 10 else per)", "int(idx.size)",
             PART_PROPS),
    # ---- presets
    Mutation("preset-seeds-first-grid", "presets", "--seeds replaces the seeds of the first grid of a grid list only",
             "fedvls_flwr/experiments/preset.py", "        if seeds is not None:\n",
             "        if seeds is not None and grid is grids[0]:\n", PRESET_PROPS),
    Mutation("preset-variants-null", "presets", "'variants:' left empty (null or []) gives no runs or an error",
             "fedvls_flwr/experiments/preset.py", 'variants = spec.get("variants") or [{}]',
             'variants = spec.get("variants", [{}])', PRESET_PROPS),
    Mutation("preset-grid-empty-list", "presets", "'grid: []' gives a preset without runs instead of the base run",
             "fedvls_flwr/experiments/preset.py", 'grids = spec.get("grid") or {}', 'grids = spec.get("grid", {})',
             PRESET_PROPS),
    Mutation("preset-set-under-grid", "presets", "--set no longer overrides the grid's and the variants' values",
             "fedvls_flwr/experiments/preset.py", "overrides = {**base, **combo, **variant, **(sets or {})}",
             "overrides = {**base, **(sets or {}), **combo, **variant}", PRESET_PROPS),
    Mutation("only-ignores-defaults", "presets", "--only KEY=VALUE never matches a run that leaves KEY at its default",
             "fedvls_flwr/experiments/sweep.py", "r.get(k, defaults.get(k)) == v", "r.get(k) == v", PRESET_PROPS),
    # ---- report tables and the run summary
    Mutation("gap-paired-by-position", "report tables",
             "a paired gap subtracts the two columns' runs in folder order, not seed by seed",
             "fedvls_flwr/experiments/tables.py",
             "values = [a.best_values[a.seeds.index(s)] - b_by_seed[str(s)] for s in seeds]",
             "values = [x - y for x, y in zip(a.best_values, b.best_values)]", TABLE_PROPS),
    Mutation("table-best-counts-round-0", "report tables",
             "a run without best/final in its summary counts the initial model (round 0) as a trained round",
             "fedvls_flwr/experiments/runs.py", "if _round_of(r) >= 1 and math.isfinite(_num(r.get(\"accuracy\")))",
             "if _round_of(r) >= 0 and math.isfinite(_num(r.get(\"accuracy\")))", TABLE_PROPS),
    Mutation("table-100-percent-read-as-percent", "report tables",
             "a run whose best accuracy is exactly 1.0 is read as already in percent (shown as 1%)",
             "fedvls_flwr/experiments/runs.py", "max(finite) > 1.0 + 1e-9", "max(finite) >= 1.0", TABLE_PROPS),
    Mutation("summary-best-counts-round-0", "report tables", "summary.json's best accuracy counts round 0 (the initial model)",
             "fedvls_flwr/app/results.py",
             'trained = [r for r in rounds if r.get("round", 0) >= 1 and r.get("accuracy") is not None]',
             'trained = [r for r in rounds if r.get("round", 0) >= 0 and r.get("accuracy") is not None]', TABLE_PROPS),
    Mutation("replies-per-node-unsorted", "report tables",
             "the summary's replies per machine are listed in first-seen order, not most first",
             "fedvls_flwr/app/results.py", "return dict(total.most_common())", "return dict(total)", TABLE_PROPS),
    # ---- sampling
    Mutation("sample-same-every-round", "sampling", "every round samples the same clients",
             "fedvls_flwr/algorithms/sampling.py",
             "rng = random.Random(seed * 1_000_003 + server_round)", "rng = random.Random(seed * 1_000_003)",
             (*SAMPLE, *STRAT)),
    Mutation("sample-one-too-few", "sampling", "a round samples one client fewer than fraction-train says",
             "fedvls_flwr/algorithms/sampling.py",
             "return max(1, int(nodes * fraction_train + 1e-9))", "return max(1, int(nodes * fraction_train + 1e-9) - 1)",
             (*SAMPLE, *STRAT)),
    Mutation("sample-by-node-id", "sampling", "clients drawn in Flower's random node-id order, not by partition",
             "fedvls_flwr/algorithms/sampling.py",
             "key=lambda n: (n not in partitions, partitions.get(n, 0), n)", "key=lambda n: n", (*SAMPLE, *STRAT)),
    Mutation("sample-float-floor", "sampling",
             "clients per round floors n * fraction-train in floating point (0.29 * 100 clients -> 28)",
             "fedvls_flwr/algorithms/sampling.py",
             "return max(1, int(nodes * fraction_train + 1e-9))", "return max(1, int(nodes * fraction_train))",
             SAMPLE),
    Mutation("sample-seed-ignored", "sampling", "the client sample depends on the round only, not on the run's seed",
             "fedvls_flwr/algorithms/sampling.py",
             "rng = random.Random(seed * 1_000_003 + server_round)", "rng = random.Random(server_round)", SAMPLE),
    # ---- round rules
    Mutation("min-fit-fraction-ignored", "round rules", "a round is accepted whatever min-fit-fraction says",
             "fedvls_flwr/app/strategy.py",
             "if new_arrays is not None and self.report.accepted >= needed:", "if new_arrays is not None:", STRAT),
    Mutation("min-replies-floor", "round rules", "the replies needed round down instead of up",
             "fedvls_flwr/app/strategy.py",
             "math.ceil(self.cfg.min_fit_fraction * sampled - 1e-9)", "math.floor(self.cfg.min_fit_fraction * sampled + 1e-9)",
             STRAT),
    Mutation("no-retry", "round rules", "a failed round is not re-run (round-retries ignored)",
             "fedvls_flwr/app/strategy.py",
             "for attempt in range(self.cfg.round_retries + 1):", "for attempt in range(1):", STRAT),
    # ---- checkpoint and resume
    Mutation("server-state-not-saved", "checkpoint and resume", "the server parts' state is never written to the checkpoint",
             "fedvls_flwr/algorithms/parts.py",
             'return {f"{kind}/{key}": value for kind, part in parts.items() for key, value in part.state().items()}',
             "return {}", RESUME),
    Mutation("server-state-not-loaded", "checkpoint and resume", "the checkpoint's server-part state is never loaded back",
             "fedvls_flwr/app/strategy.py",
             "            part.load_state(saved[kind])\n", "            pass\n", RESUME),
    Mutation("companion-state-not-loaded", "checkpoint and resume",
             "only the server optimizer's state is loaded back: a client part's companion (FedGF) starts afresh",
             "fedvls_flwr/app/strategy.py",
             "            part.load_state(saved[kind])\n",
             "            part.load_state(saved[kind]) if kind == 'server-optimizer' else None\n",
             ("tests/test_downlink.py", *GF)),
    Mutation("momentum-not-restored", "checkpoint and resume", "FedAvgM restarts with zero momentum after a resume",
             "fedvls_flwr/algorithms/server_optim.py",
             'self.velocity = [state[f"momentum/{i}"] for i in range(count)] or None', "self.velocity = None", RESUME),
    # ---- the fence's configuration
    Mutation("control-api-open", "fence config", "the Control API is passed on without a client certificate",
             "fedvls_flwr/deploy/fence.py",
             "if ($ssl_client_verify != SUCCESS) {{", "if ($ssl_client_verify = NEVER) {{", FENCE),
    Mutation("runtime-api-passed", "fence config", "everything else (Runtime API, docs) is passed on too",
             "fedvls_flwr/deploy/fence.py",
             """        return 403 '{DENIED % "only the Fleet API is served here"}';""",
             "        proxy_pass https://{upstream};", FENCE),
    Mutation("loopback-names-unchecked", "fence config", "fence-config accepts a server.pem without 127.0.0.1/localhost",
             "fedvls_flwr/deploy/cli.py", "    if lacking:\n", "    if False:\n", FENCE),
    Mutation("server-cert-as-client", "fence config", "the operator link accepts a serverAuth-only certificate",
             "fedvls_flwr/deploy/fence.py",
             "if ExtendedKeyUsageOID.CLIENT_AUTH not in usage:", "if False:", FENCE),
    # ---- the paper's last rows: FedConcat (a protocol) and FedGF (a local optimizer with server state)
    Mutation("fedconcat-head-weighted", "new methods", "FedConcat's stage 2 weighs the heads by sample count",
             "fedvls_flwr/algorithms/fedconcat.py",
             "mean = np.mean([r.arrays[name].astype(np.float64) for r in replies], axis=0)",
             "mean = np.average([r.arrays[name].astype(np.float64) for r in replies], axis=0, "
             "weights=[r.num_examples for r in replies])", CONCAT),
    Mutation("fedconcat-cluster-counts", "new methods", "FedConcat clusters raw counts instead of label distributions",
             "fedvls_flwr/algorithms/fedconcat.py", "distributions = counts / sizes", "distributions = counts", CONCAT),
    Mutation("fedconcat-one-kmeans-start", "new methods", "FedConcat's K-means takes one k-means++ start, not the authors' 10",
             "fedvls_flwr/algorithms/fedconcat.py", "KMeans(n_clusters=clusters, n_init=10,",
             "KMeans(n_clusters=clusters, n_init=1,", CONCAT),
    Mutation("fedconcat-head-unseeded", "new methods", "FedConcat's new head is drawn unseeded (a resume draws another)",
             "fedvls_flwr/algorithms/fedconcat.py",
             "generator = torch.Generator().manual_seed(self.cfg.seed * 1_000_003 + 21)",
             "generator = torch.Generator().manual_seed(torch.seed())", CONCAT),
    Mutation("fedconcat-one-head-step", "new methods", "FedConcat's clients take one head step instead of fedconcat-head-steps",
             "fedvls_flwr/algorithms/fedconcat.py", "steps = min(self.head_steps,", "steps = min(1,", CONCAT),
    Mutation("fedconcat-encoders-every-time", "new methods", "FedConcat forgets which nodes hold the encoders",
             "fedvls_flwr/algorithms/fedconcat.py",
             "self._has_encoders |= {int(r.client) for r in replies if int(r.client) in self._sending_encoders}",
             "pass", CONCAT),
    Mutation("fedconcat-split-floored", "new methods",
             "FedConcat's 1 : 20 split floors R / 21 instead of rounding it (one encoder round short at some R)",
             "fedvls_flwr/algorithms/fedconcat.py", "max(1, round(num_rounds / 21))", "max(1, num_rounds // 21)",
             CONCAT_PROPS),
    Mutation("fedconcat-setting-one-ignored", "new methods",
             "fedconcat-encoder-rounds = 1 falls back to the 1 : 20 split", "fedvls_flwr/algorithms/fedconcat.py",
             "    if setting > 0:\n        return setting\n", "    if setting > 1:\n        return setting\n",
             CONCAT_PROPS),
    Mutation("fedgf-mix-flipped", "new methods", "FedGF mixes with 1 - c where c belongs",
             "fedvls_flwr/algorithms/fedgf.py", "torch._foreach_mul_(everything, 1.0 - self.c)",
             "torch._foreach_mul_(everything, self.c)", GF),
    Mutation("fedgf-u-reversed", "new methods", "FedGF perturbs along new - old instead of old - new",
             "fedvls_flwr/algorithms/fedgf.py", "u = {k: old[k] - new[k] for k in keys}",
             "u = {k: new[k] - old[k] for k in keys}", GF),
    Mutation("fedconcat-boundary-from-resumed-rounds", "new methods",
             "a FedConcat run resumed with another num-server-rounds moves its stage boundary",
             "fedvls_flwr/algorithms/fedconcat.py", "        self.encoder_rounds = saved\n", "", CONCAT),
    Mutation("fedconcat-encoders-train-mode", "new methods",
             "FedConcat's frozen encoders run in train mode in stage 2 (BatchNorm statistics drift)",
             "fedvls_flwr/algorithms/fedconcat.py", "        self.encoders.eval()  # frozen", "        pass  # frozen", CONCAT),
    Mutation("fedconcat-sites-unchecked", "new methods",
             "fedvls check lets FedConcat ask K-means for more clusters than the federation has sites",
             "fedvls_flwr/algorithms/fedconcat_spec.py", "if not assignment and k > nodes:", "if False:", CONCAT),
    Mutation("fedgf-window-untrimmed", "new methods", "FedGF's adaptive c averages every round, not the last W",
             "fedvls_flwr/algorithms/fedgf.py", "            del self.window[: -self.window_size]\n", "", GF),
    Mutation("fedgf-report-next-c", "new methods", "FedGF's round record names the next round's c, not the one its clients used",
             "fedvls_flwr/algorithms/fedgf.py", 'return {"fedgf_c": self.sent_c,', 'return {"fedgf_c": self.c,', GF),
    Mutation("loss-under-autocast", "new methods", "the loss runs under bfloat16 autocast with the model (amp)",
             "fedvls_flwr/algorithms/objectives/base.py", "if torch.is_autocast_enabled(device_type):", "if False:",
             ("tests/test_fedmr.py",)),
    Mutation("fedmr-biased-variance", "new methods", "FedMR standardises with the biased variance",
             "fedvls_flwr/algorithms/objectives/fedmr.py", "/ (counts - 1).clamp(min=1)", "/ counts.clamp(min=1)",
             ("tests/test_fedmr.py",)),
    Mutation("fedmr-divide-by-batch", "new methods", "FedMR divides by the batch size, not the counted samples",
             "fedvls_flwr/algorithms/objectives/fedmr.py", "/ total.clamp(min=1)", "/ n", ("tests/test_fedmr.py",)),
    Mutation("fedmr-singletons-counted", "new methods", "FedMR counts classes seen once",
             "fedvls_flwr/algorithms/objectives/fedmr.py", "counted = (counts >= 2).to(h.dtype)",
             "counted = (counts >= 1).to(h.dtype)", ("tests/test_fedmr.py",)),
    # ---- what a site shares
    Mutation("class-counts-always-sent", "site shares", "every training reply carries the site's class counts",
             "fedvls_flwr/app/client.py", "           if cfg.share_class_counts else {}),", "           if True else {}),",
             ("tests/test_site_shares.py",)),
    Mutation("split-counts-shifted", "site shares", "the server's rebuilt split names each partition's counts one id off",
             "fedvls_flwr/data/node_data.py", "for pid, idx in enumerate(parts)}", "for pid, idx in enumerate(parts, 1)}",
             ("tests/test_site_shares.py",)),
    # ---- evaluation and the client's randomness
    Mutation("evaluation-augments", "evaluation", "the evaluation transform augments the test images (train mode)",
             "fedvls_flwr/algorithms/training.py", "transform = make_batch_transform(mean, std, train=False, augment=False)",
             "transform = make_batch_transform(mean, std, train=True, augment=True)", INVARIANTS),
    Mutation("evaluation-in-train-mode", "evaluation", "evaluation leaves the model in train mode (BatchNorm batch statistics)",
             "fedvls_flwr/algorithms/training.py", "    model.to(device).eval()\n", "    model.to(device)\n", INVARIANTS),
    Mutation("client-seed-without-round", "randomness", "the client's batch order and augmentation ignore the round",
             "fedvls_flwr/app/client.py", "np.random.SeedSequence([cfg.seed, server_round, partition_id])",
             "np.random.SeedSequence([cfg.seed, partition_id])", INVARIANTS),
    Mutation("client-seed-without-partition", "randomness", "every partition draws the same batch order and augmentation",
             "fedvls_flwr/app/client.py", "np.random.SeedSequence([cfg.seed, server_round, partition_id])",
             "np.random.SeedSequence([cfg.seed, server_round])", INVARIANTS),
    Mutation("client-seed-without-seed", "randomness", "the client's batch order and augmentation ignore the run's seed",
             "fedvls_flwr/app/client.py", "np.random.SeedSequence([cfg.seed, server_round, partition_id])",
             "np.random.SeedSequence([server_round, partition_id])", INVARIANTS),
    Mutation("augmentation-unseeded", "randomness", "the augmentation draws from torch's global generator, not the round's",
             "fedvls_flwr/algorithms/training.py",
             "transform = make_batch_transform(data.mean, data.std, train=True, augment=cfg.augment, generator=generator)",
             "transform = make_batch_transform(data.mean, data.std, train=True, augment=cfg.augment)", INVARIANTS),
    # ---- the app against the reference loop (tests/test_differential.py)
    Mutation("batch-seed-order-swapped", "sampling", "a client seeds its batch order with (seed, partition, round), "
             "not (seed, round, partition): every run still reproduces itself",
             "fedvls_flwr/app/client.py", "SeedSequence([cfg.seed, server_round, partition_id])",
             "SeedSequence([cfg.seed, partition_id, server_round])", DIFF),
    Mutation("client-state-not-kept", "client state", "the ClientApp never writes the client's state back to the "
             "node's Context: MOON has no previous model and carried momentum restarts every round",
             "fedvls_flwr/app/client.py", "        save_client_state(client_state, state)\n", "        pass\n", DIFF),
    Mutation("client-state-change-in-place-ignored", "client state", "a part's state changed in place is taken for "
             "the state it was given: its record is not written again and the next round reads the old values",
             "fedvls_flwr/app/client.py", "or tensor._version != version:", "or False:", ("tests/test_baselines.py",)),
    Mutation("round-files-read-server-state-late", "result files", "a round's checkpoint takes the server parts' "
             "state by reference, and the thread that writes it while the next round trains reads what that round "
             "changed", "fedvls_flwr/app/server.py",
             "**{key: np.array(value, copy=True) for key, value in self.strategy.server_state().items()}}",
             "**self.strategy.server_state()}", ("tests/test_resume.py",)),
    Mutation("round-files-block-the-next-round", "result files", "the server waits for a round's files before "
             "the next round trains (the writing thread's time added to every round)",
             "fedvls_flwr/app/server.py",
             "jsonable(record), checkpoint, clients)\n        except RuntimeError:",
             "jsonable(record), checkpoint, clients)\n            self.finish_saving()\n        except RuntimeError:",
             ("tests/test_resume.py",)),
    Mutation("ctrl-c-abandons-round-files", "result files", "Ctrl-C while a round's files are being written leaves "
             "without them: the round is lost though it was computed",
             "fedvls_flwr/app/server.py",
             "            if (unwritten_at_exit := self.settle_saving()) is not None:  # Ctrl-C: the round being written is "
             "still written\n                self._unwritten_warning(unwritten_at_exit)\n"
             "            self.saver.shutdown(wait=True)\n",
             "            self.saver.shutdown(wait=False)\n", ("tests/test_resume.py",)),
    Mutation("failed-round-ignores-round-being-written", "result files", "a run that fails while the round before is "
             "being written reports the rounds on disk before that write ends: summary.json counts one round too few",
             "fedvls_flwr/app/server.py", "            unwritten = self.settle_saving()\n",
             "            unwritten = None\n", ("tests/test_resume.py",)),
    Mutation("full-disk-hidden-by-failed-round", "result files", "a round's files that fail on their thread while "
             "the next round fails too are only a warning: the run's error says the unwritten round is saved",
             "fedvls_flwr/app/server.py", "            if isinstance(unwritten, OSError):\n",
             "            if False:\n", ("tests/test_resume.py",)),
    Mutation("ctrl-c-forgets-failed-write", "result files", "Ctrl-C while the server waits for a round's files drops "
             "that write: if it then fails, nothing says the folder holds the round before",
             "fedvls_flwr/app/server.py", "            if saving.done():\n                self.saving = None\n",
             "            if True:\n                self.saving = None\n", ("tests/test_resume.py",)),
    Mutation("node-copy-keeps-shared-lists", "engine", "a node's copy of a message keeps two keys that share a list "
             "sharing it, where Flower's wire gives each its own",
             "fedvls_flwr/ops/flower_internals.py", "            copied[key] = list(value)  # type: ignore[assignment]\n",
             "            pass\n", ("tests/test_flower_internals.py",)),
    Mutation("node-copy-trusts-every-value", "engine", "a node's copy of a message keeps numpy scalars, subclasses "
             "and values put into a list after Flower checked it, which flwr run converts or refuses",
             "fedvls_flwr/ops/flower_internals.py", "and _all_sent_as_is(record.values(), kinds):",
             "and True:", ("tests/test_flower_internals.py",)),
    Mutation("config-with-shares-lists", "engine", "a round's config shares its lists with the run config kept "
             "for every round: a message changed in place changes the next round's",
             "fedvls_flwr/app/messages.py",
             "            record[key] = list(value)  # type: ignore[assignment]\n    for key, value in changes",
             "            pass\n    for key, value in changes", ("tests/test_messages.py",)),
    Mutation("record-read-of-any-kind", "engine", "a message's record is read whatever its kind: a reply's "
             "ConfigRecord named like the expected MetricRecord is taken for it",
             "fedvls_flwr/app/messages.py", "    if not isinstance(record, kind):\n        raise KeyError(key)",
             "    if record is None:\n        raise KeyError(key)", ("tests/test_messages.py",)),
    Mutation("npy-header-by-dtype-only", "engine", "an array's kept npy header is reused for any array of its "
             "dtype: a reply's array of another shape carries the first one's shape",
             "fedvls_flwr/app/messages.py", "    key = (dtype.str, value.shape)", "    key = (dtype.str, ())",
             ("tests/test_messages.py",)),
    Mutation("run-config-dict-shared", "engine", "to_flower gives every caller the one dict it keeps: a caller "
             "that changes its copy changes what the next message carries",
             "fedvls_flwr/config/run_config.py", "        return dict(flower)", "        return flower",
             ("tests/test_config.py",)),
    Mutation("events-built-unseen", "engine", "a structured event is built and logged at DEBUG whether or not a "
             "handler shows DEBUG (a JSON line a client, for nobody)",
             "fedvls_flwr/app/events.py", "    if _shown(logging.DEBUG):", "    if _logger.isEnabledFor(logging.DEBUG):",
             ("tests/test_events.py",)),
    Mutation("events-ignore-propagate", "engine", "an event goes on to the root's handlers although Flower's logger "
             "does not propagate (a record built that no handler gets)",
             "fedvls_flwr/app/events.py", "        if not logger.propagate:\n            break\n", "",
             ("tests/test_events.py",)),
    Mutation("client-draws-reach-the-server", "engine", "the clients the in-process engine runs in the server's "
             "process draw from the server's random generators and leave them advanced, where under flwr run they "
             "are other processes",
             "fedvls_flwr/ops/inprocess.py",
             "with generators_apart(self.client_generators) if self.pool is None else nullcontext():",
             "with nullcontext():", ("tests/test_client_workers.py",)),
    Mutation("client-draws-restart-every-round", "engine", "the clients the in-process engine runs in the server's "
             "process start every round from the server's random generators, drawing the same numbers round after "
             "round, where a Ray actor's go on",
             "fedvls_flwr/ops/client_worker.py", "    clients.state = (*clients_cpu, clients_cuda)\n", "",
             ("tests/test_client_workers.py",)),
    Mutation("client-cuda-read-before-server-restored", "engine", "around the clients the in-process engine runs "
             "in the server's process, the clients' CUDA generators are read before the server's generators go back: "
             "a CUDA error there hides the clients' own error and leaves the server with the clients' state",
             "fedvls_flwr/ops/client_worker.py",
             "    clients_cpu = _cpu_generators()  # copies: nothing here fails\n",
             "    clients_cpu = _cpu_generators()  # copies: nothing here fails\n    _cuda_generators()\n",
             ("tests/test_client_workers.py",)),
    Mutation("cuda-opened-by-clients-not-reseeded", "engine", "a client that opens CUDA in the server's process "
             "leaves the server's CUDA generators where the clients' draws took them (none was saved), and a CUDA "
             "seed a client queued becomes the server's",
             "fedvls_flwr/ops/client_worker.py",
             "            torch.cuda.manual_seed_all(server_seed)\n", "            pass\n",
             ("tests/test_client_workers.py",)),
    Mutation("frozen-arrays-not-read-back", "checkpoint and resume", "a checkpoint that takes the arrays that "
             "stopped changing from its frozen file is read without them (a FedConcat run resumed in stage 2 "
             "without its encoders)",
             "fedvls_flwr/app/results.py", "        arrays.update({str(name): frozen[str(name)] for name in names.tolist()})\n",
             "", ("tests/test_results.py",)),
    Mutation("frozen-file-kept-stale", "checkpoint and resume", "a frozen file written for arrays that then "
             "changed is still named by the checkpoint (the old values read back on resume)",
             "fedvls_flwr/app/results.py",
             "frozen = {k for k, v in large.items() if (kept := kept_frozen.get(k)) is not None and (kept is v or kept == v)}",
             "frozen = {k for k, v in large.items() if (kept := kept_frozen.get(k)) is not None}",
             ("tests/test_results.py",)),
    Mutation("frozen-file-left-unnamed", "checkpoint and resume", "a frozen file no checkpoint names any more "
             "(its arrays changed again, or a resumed run's first checkpoint) stays in the run folder",
             "fedvls_flwr/app/results.py", "            if stale.name != named:\n",
             "            if stale.name != named and named is not None:\n", ("tests/test_results.py",)),
    Mutation("kept-head-bias-not-loaded", "new methods", "a FedConcat node reusing the process's concatenated model "
             "loads the received head's weight but keeps the last node's bias",
             "fedvls_flwr/algorithms/fedconcat.py", "        linear.bias.copy_(bias)\n", "", ("tests/test_fedconcat.py",)),
    Mutation("node-data-answer-ignores-environment", "data", "a node's data kept as the answer to its next "
             "messages is handed out after the environment a relative data-dir is resolved against changed",
             "fedvls_flwr/data/node_data.py", "tuple(os.environ.get(name) for name in _PATH_ENVIRONMENT),", "(),",
             ("tests/test_node_data.py",)),
    Mutation("node-data-answer-outlives-the-dataset", "data", "a node's data kept as the answer to its next "
             "messages is handed out after the dataset cache was cleared (a partition of the forgotten dataset)",
             "fedvls_flwr/data/node_data.py", "if generation == cache_generation() and kept", "if kept",
             ("tests/test_node_data.py",)),
    Mutation("finished-log-read-once", "deployment", "a finished run's log is read once, as soon as Flower says it "
             "finished: on a busy SuperLink its last lines (the last round, a refusal) are not in it yet",
             "fedvls_flwr/ops/launch.py", "self.settled_logs(run_id) if read_log", "self.logs(run_id) if read_log",
             ("tests/test_deploy_tools.py",)),
    Mutation("worker-message-not-as-sent", "engine", "with client workers a node's message keeps numpy scalars and "
             "subclasses in its config, and a value put into a list after Flower checked it gets through, where "
             "flwr run converts or refuses them",
             "fedvls_flwr/ops/client_pool.py", "encode_records(message.content, numbering, as_sent=True)",
             "encode_records(message.content, numbering)", ("tests/test_client_workers.py",)),
    Mutation("worker-reply-not-as-sent", "engine", "with client workers the server gets a reply's numpy scalars as "
             "numpy scalars, where Flower's wire gives floats",
             "fedvls_flwr/ops/client_pool.py", "decode_records(body[1], blob, as_sent=True)",
             "decode_records(body[1], blob)", ("tests/test_client_workers.py",)),
    Mutation("fedconcat-digest-ignored", "client state", "the process's concatenated model is reused whatever "
             "the digest of the node's encoders says: a node with other encoders trains the head over the wrong ones",
             "fedvls_flwr/algorithms/fedconcat.py", "same = digest == self.digest", "same = True",
             ("tests/test_fedconcat.py",)),
    Mutation("moon-previous-is-global", "client state", "MOON's negative is the received global model, "
             "not the client's model of its previous round",
             "fedvls_flwr/algorithms/training.py", "            previous.load_state_dict(objective.previous_model)\n",
             "            pass\n", DIFF),
    Mutation("teacher-cached-in-train-mode", "objectives", "the teacher's output is computed once per round even in "
             "train mode with BatchNorm (whole-data batch statistics instead of each batch's)",
             "fedvls_flwr/algorithms/training.py",
             "deterministic = not transform.augments and not (train_mode and mode_dependent(model))",
             "deterministic = not transform.augments", DIFF),
    Mutation("downlink-values-dropped", "new methods", "a client drops the downlink's values: FedGF's c is 0 and "
             "its clients silently run FedSAM", "fedvls_flwr/app/client.py",
             "    if has_record(content, keys.DOWNLINK_VALUES, ConfigRecord):", "    if False:", DIFF),
    Mutation("fedexp-evaluates-last", "round rules", "the server evaluates the last global model whatever "
             "fedexp-eval says (average-last-two ignored)", "fedvls_flwr/app/strategy.py",
             "return self.server_optimizer.evaluation_arrays(read_only_dict(arrays))",
             "return read_only_dict(arrays)", DIFF),
    # ---- what a reply carries and where it ran
    Mutation("query-shares-undeclared", "site shares", "a site answers a query for its class counts whether or not "
             "a part of the run declares them", "fedvls_flwr/app/client.py",
             'if "class-counts" in wanted & site_shares(cfg.to_flower()):', 'if "class-counts" in wanted:', REPLIES),
    Mutation("local-eval-always-sent", "site shares", "every training reply carries the per-class test accuracy, "
             "local-eval or not", "fedvls_flwr/app/client.py",
             "if cfg.local_eval and outcome.model is not None:", "if outcome.model is not None:", REPLIES),
    Mutation("round-nodes-by-flower-id", "round records", "a round counts its replies by Flower's random node id, "
             "not by the machine each reply names", "fedvls_flwr/app/server.py",
             '"nodes": count_by(report.clients, "ran_on"),', '"nodes": count_by(report.clients, "node"),',
             ("tests/test_round_machines.py",)),
    # ---- bugs the independent reference (tests/test_differential.py) and the steered
    # property tests feel, each in code the old differential test shared with the app or never reached
    Mutation("fedntd-tau-not-squared", "objectives", "FedNTD's distillation is weighted beta * tau, not "
             "beta * tau^2 (the same at the default tau = 1)", "fedvls_flwr/algorithms/objectives/baselines.py",
             '"ntd": (self.beta * self.tau**2) * kl', '"ntd": (self.beta * self.tau) * kl', DIFF),
    Mutation("fedlmd-weight-10pct-low", "objectives", "FedLMD's distillation term weighs 10% less than beta * T^2",
             "fedvls_flwr/algorithms/objectives/baselines.py", '"lmd": (self.beta * self.tau**2) * kl',
             '"lmd": (0.9 * self.beta * self.tau**2) * kl', DIFF),
    Mutation("fedvls-dis-10pct-low", "objectives", "FedVLS's vacant-class distillation weighs 0.9 lambda",
             "fedvls_flwr/algorithms/objectives/fedvls.py", "scale = self.lambda_dis / B",
             "scale = 0.9 * self.lambda_dis / B", DIFF),
    Mutation("fedlc-paper-form-ignored", "objectives", "fedlc-form = paper computes the standard form",
             "fedvls_flwr/algorithms/objectives/baselines.py", 'if self.form == "standard":', "if True:", DIFF),
    Mutation("fedrs-proportional-ignored", "objectives", "fedrs-form = proportional scales as the binary form",
             "fedvls_flwr/algorithms/objectives/baselines.py", 'if settings["fedrs-form"] == "binary":', "if True:",
             DIFF),
    Mutation("teacher-mode-ignored", "objectives", "the teacher runs in eval mode whatever teacher-mode says",
             "fedvls_flwr/algorithms/objectives/base.py", 'return str(self.settings.get("teacher-mode", "eval"))',
             'return "eval"', DIFF),
    Mutation("weight-decay-dropped", "local training", "the local SGD step leaves weight decay out",
             "fedvls_flwr/algorithms/sgd.py", "        if self.weight_decay != 0.0:\n", "        if False:\n", DIFF),
    Mutation("fedexp-eps-10x", "aggregation", "FedExP's step size adds 10 eps to ||d_bar||^2, not eps",
             "fedvls_flwr/algorithms/server_optim.py", "mean_sq / (2 * (bar_sq + self.eps))",
             "mean_sq / (2 * (bar_sq + 10 * self.eps))", DIFF),
    Mutation("adam-bias-correction-off-by-one", "aggregation", "FedAdam corrects its bias as Adam's step t, not "
             "t + 1 (Flower's convention)", "fedvls_flwr/algorithms/server_optim.py",
             "np.sqrt(1 - np.power(self.beta2, server_round + 1.0)) / (\n                1 - np.power(self.beta1, "
             "server_round + 1.0)",
             "np.sqrt(1 - np.power(self.beta2, server_round)) / (\n                1 - np.power(self.beta1, "
             "server_round)", DIFF),
    Mutation("fmnist-std-digits-swapped", "data", "Fashion-MNIST normalised by std 0.3503 (two digits swapped) "
             "instead of 0.3530", "fedvls_flwr/data/idx.py", "FMNIST_STD = 0.3530", "FMNIST_STD = 0.3503", DIFF),
    Mutation("dirichlet-cuts-rounded", "partitioning", "Dirichlet cuts each class at the rounded cumulative "
             "shares, not NIID-Bench's floor", "fedvls_flwr/data/partition.py",
             "cuts = (np.cumsum(p) * idx.size).astype(int)[:-1]",
             "cuts = np.round(np.cumsum(p) * idx.size).astype(int)[:-1]", DIFF),
    Mutation("labeldir-narrow-draw", "partitioning", "noniid-labeldir draws holder sizes below n_c / k on 10-class "
             "data too (the authors draw up to n_c there)", "fedvls_flwr/data/partition.py",
             "int(idx.size if num_classes <= 10 else per)", "int(per)", DIFF),
    Mutation("labeldir-holders-reversed", "partitioning", "noniid-labeldir deals a class's slices to its holders "
             "last first", "fedvls_flwr/data/partition.py", "for j, size in zip(holders, sizes):",
             "for j, size in zip(holders[::-1], sizes):", PART_PROPS),
    Mutation("mobilenetv2-imagenet-stride", "models", "MobileNetV2's second stage keeps the ImageNet stride 2 "
             "(the CIFAR network runs it at 1)", "fedvls_flwr/models.py", "        (6, 24, 2, 1),  # stride 2",
             "        (6, 24, 2, 2),  # stride 2", DIFF),
    Mutation("resnet32-shortcut-padded-on-one-side", "models", "ResNet-32's parameter-free shortcut pads every new "
             "channel after the old ones (option A splits them)", "fedvls_flwr/models.py",
             "self.pad = (extra // 2, extra - extra // 2)", "self.pad = (0, extra)", DIFF),
    Mutation("moon-head-half-width", "models", "MOON's projection head narrows to d/2 (the FedVLS code's copy), "
             "not the MOON authors' d", "fedvls_flwr/models.py",
             "nn.Linear(width, width), nn.ReLU(inplace=True), nn.Linear(width, out_dim)",
             "nn.Linear(width, width // 2), nn.ReLU(inplace=True), nn.Linear(width // 2, out_dim)", DIFF),
    Mutation("fedntd-beta-default-from-fedvls-table", "defaults", "pyproject's FedNTD beta is the FedVLS table's "
             "0.1, not the FedNTD authors' 1", "pyproject.toml", "fedntd-beta = 1.0", "fedntd-beta = 0.1", DIFF),
    Mutation("flip-probability-0.4", "augmentation", "a training image is mirrored with probability 0.4, not 1/2",
             "fedvls_flwr/data/augment.py", "flips = torch.rand(n, generator=generator) < 0.5",
             "flips = torch.rand(n, generator=generator) < 0.4", AUGMENT_PROPS),
    Mutation("preset-duplicates-by-name-only", "presets", "a preset with a key at its default in one run and left "
             "out in another runs the same experiment twice", "fedvls_flwr/experiments/preset.py",
             "        if one in settings[:i]:\n", "        if False:\n", PRESET_PROPS),
    Mutation("fedconcat-asks-with-assignment", "site shares", "FedConcat queries the sites before round 1 although "
             "fedconcat-assignment gives the clusters", "fedvls_flwr/algorithms/fedconcat.py",
             "        return not self.assignment_setting\n", "        return True\n", REPLIES),
    Mutation("site-shares-ignore-assignment", "site shares", "a FedConcat site with its cluster given still "
             "answers a query with its class counts", "fedvls_flwr/config/registry.py",
             "if part.shares_needed is None or part.shares_needed(values) for s in part.shares)",
             "for s in part.shares)", REPLIES),
    # ---- devices
    Mutation("auto-never-cuda", "devices", "device='auto' never picks CUDA",
             "fedvls_flwr/algorithms/training.py",
             'if requested == "cuda" or (requested == "auto" and torch.cuda.is_available()):',
             'if requested == "cuda":', ("tests/test_device.py",)),
    Mutation("deterministic-stays-on-for-the-next-run", "devices", "a process that ran a deterministic=true "
             "run keeps torch's deterministic kernels and full-float32 settings for a deterministic=false run "
             "after it (a kept client worker, a sweep worker)", "fedvls_flwr/algorithms/device.py",
             "        if _before_deterministic is not None:\n", "        if False:\n", ("tests/test_device.py",)),
    Mutation("broken-gpu-context-worker-kept", "engine", "a client worker whose GPU context broke (a device-side "
             "assert) keeps serving, and every message it takes for the rest of the run fails",
             "fedvls_flwr/ops/client_worker.py", "        retire = reply.has_error() and gpu_context_broken()\n",
             "        retire = False\n", ("tests/test_client_workers.py",)),
    Mutation("retired-worker-drops-its-queued-message", "engine", "the message queued behind one whose GPU "
             "context broke is dropped with the retired worker instead of going back to the queue (the round "
             "waits for its reply until round-timeout)", "fedvls_flwr/ops/client_pool.py",
             "for task in reversed(held[1:] if running_failed else held):", "for task in reversed(held[1:]):",
             ("tests/test_client_workers.py",)),
    Mutation("gpus-torch-cannot-use-planned", "devices", "workers are planned on GPUs the device files or "
             "CUDA_VISIBLE_DEVICES show but torch cannot use (an index past the last GPU: those workers fail at "
             "their first message; a CPU-only torch: they train on the CPU under a line that says cuda)",
             "fedvls_flwr/ops/resources.py", "    if gpus > 0 and (usable := torch_gpus()) is not None and usable < gpus:",
             "    if False and (usable := torch_gpus()) is not None and usable < gpus:",
             ("tests/test_client_workers.py",)),
    Mutation("idle-dead-worker-fails-the-next-message", "engine", "a worker killed while idle (between "
             "rounds, between two runs of a kept pool) fails the message next handed to it, which never ran",
             "fedvls_flwr/ops/client_pool.py", "        self._replace(slot, text, running_failed=task.handed_to_dead > 1)",
             "        self._replace(slot, text, running_failed=True)", ("tests/test_client_workers.py",)),
    Mutation("refused-reply-fails-as-a-crash", "engine", "a reply holding a value Flower refuses fails as a "
             "crashed client and the run goes on, where delivering it in one process stops the run with Flower's "
             "error", "fedvls_flwr/ops/client_pool.py", "            raise _UnreadableReply(err) from err",
             "            raise", ("tests/test_client_workers.py",)),
    Mutation("pool-thread-error-ends-its-worker", "engine", "an error in the server's own handling of a worker "
             "ends that worker's thread: its message fails with no reason given and the worker is gone for the "
             "rest of the run (before the catch-all, its messages were never answered)",
             "fedvls_flwr/ops/client_pool.py", "                except Exception as err:  # noqa: BLE001 - see the docstring",
             "                except _Unqueued as err:  # noqa: BLE001 - see the docstring",
             ("tests/test_client_workers.py",)),
    Mutation("ended-runs-message-run-again", "engine", "a message of an ended run that a dying worker held "
             "goes back to the queue and is run at the start of the next run (its reply thrown away)",
             "fedvls_flwr/ops/client_pool.py",
             "                if task.generation == self._generation:  # else its run ended (forget): nobody waits for it",
             "                if True:", ("tests/test_client_workers.py",)),
    Mutation("cublas-workspace-set-only-when-deterministic", "devices", "CUBLAS_WORKSPACE_CONFIG is set only "
             "when a deterministic run starts: too late in a process that multiplied on a GPU before (torch reads "
             "it once), so a kept worker's deterministic run raises at its first matrix product",
             "fedvls_flwr/__init__.py", 'os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")',
             'os.environ.get("CUBLAS_WORKSPACE_CONFIG", ":4096:8")', ("tests/test_device.py",)),
    Mutation("closing-pool-hands-over-a-message", "engine", "a message a pool thread was preparing when "
             "close() came is handed over all the same: its worker runs the client while close() waits for it",
             "fedvls_flwr/ops/client_pool.py", "                raise _Closing", "                pass",
             ("tests/test_client_workers.py",)),
    Mutation("put-back-ignores-the-ended-run", "engine", "a message of an ended run that could not wait in a "
             "worker's socket goes back to the head of the queue and runs in the next run (its reply thrown away)",
             "fedvls_flwr/ops/client_pool.py",
             "            if task.generation == self._generation and not self._closing:",
             "            if not self._closing:", ("tests/test_client_workers.py",)),
    Mutation("allocator-opt-out-ignored", "devices", "the app sets glibc's allocator although the user said "
             "FEDVLS_SYSTEM_MALLOC=1 or set glibc's own malloc settings",
             "fedvls_flwr/app/memory.py",
             "    if not sys.platform.startswith(\"linux\") or users_own_setting() is not None:\n",
             "    if not sys.platform.startswith(\"linux\"):\n", ("tests/test_memory.py",)),
    Mutation("uninitialised-buffer-left-empty", "models", "a network with a buffer kept out of its state dict "
             "is built without initialisation all the same: that buffer holds whatever memory it was given",
             "fedvls_flwr/algorithms/run_model.py",
             "and all(id(t) in kept for t in (*skeleton.parameters(), *skeleton.buffers()))",
             "", ("tests/test_models.py",)),
    Mutation("taken-state-of-another-dtype", "models", "a network given the client's received tensors takes "
             "one of another dtype as it is: the network's dtype changes instead of the value being cast",
             "fedvls_flwr/algorithms/run_model.py",
             "    return all(key not in own or own[key].dtype == value.dtype for key, value in state.items())",
             "    return True", ("tests/test_models.py",)),
    Mutation("tied-weights-built-untied", "models", "a network that ties two names to one tensor is built "
             "on the meta device all the same: its storage gives each name a tensor of its own, untying them",
             "fedvls_flwr/algorithms/run_model.py",
             "    return len(kept) == len(own) and all(", "    return all(", ("tests/test_models.py",)),
    Mutation("reused-payload-of-another-shape", "engine", "a view over an Array's bytes is encoded as those "
             "bytes without checking their header: a reshaped view keeps the old shape in its payload",
             "fedvls_flwr/app/messages.py", " or not base.startswith(header):", ":", ("tests/test_messages.py",)),
    Mutation("reused-payload-from-its-header", "engine", "a view over an Array's bytes is encoded as those "
             "bytes without checking where it starts: one reading the header as values is sent as the payload",
             "fedvls_flwr/app/messages.py", "    if value.ctypes.data != start + len(header) or not",
             "    if not", ("tests/test_messages.py",)),
    Mutation("round-state-copied", "engine", "the server copies the round state out of its record every round "
             "(a ResNet-18's 45 MB in the round's serial part; an unchanged array is encoded again into the next record)",
             "fedvls_flwr/app/strategy.py", "        reference = self._state = read_only_dict(arrays)",
             "        reference = self._state = {k: v.copy() for k, v in read_only_dict(arrays).items()}",
             ("tests/test_strategy.py",)),
    Mutation("channels-last-weights-to-the-encoder", "engine", "a channels-last network's trained weights reach "
             "the reply's encoder strided (np.save's slow path: about 25 ms a ResNet-18 client on a GPU host)",
             "fedvls_flwr/algorithms/rounds.py",
             "    return {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()}",
             "    return {k: v.detach().cpu() for k, v in model.state_dict().items()}", ("tests/test_models.py",)),
    Mutation("feature-tap-keeps-the-step", "local training", "the feature tap keeps the last step's "
             "penultimate features (and so its autograd graph) in a kept trainer until the next step: on CUDA "
             "the next capture warns that an AccumulateGrad node's stream does not match",
             "fedvls_flwr/algorithms/training.py", "                features = tap.take() if tap is not None else None",
             "                features = tap.features if tap is not None else None",
             ("tests/test_graphed_step.py",)),
    Mutation("reply-arrays-copied", "engine", "the server copies every reply's arrays before reading them "
             "(43 MB more a ResNet-18 reply, in the round's serial part)",
             "fedvls_flwr/app/messages.py",
             "        out[key] = arr.numpy() if view is None else view\n",
             "        out[key] = arr.numpy() if view is None else view.copy()\n", ("tests/test_messages.py",)),
    Mutation("dry-run-loads-and-writes", "presets", "`fedvls sweep --dry-run` makes the output folder and loads every "
             "run's dataset, as the sweep does",
             "fedvls_flwr/experiments/sweep.py",
             "    if data:  # the costly check last",
             "    if True:  # the costly check last", ("tests/test_sweep_report.py",)),
    Mutation("report-manifest-only-at-the-end", "report tables", "a report writes its manifest only after its last "
             "file: one stopped midway leaves files no manifest lists, named as the user's ever after",
             "fedvls_flwr/experiments/report.py",
             "        atomic_write_json(out_dir / MANIFEST, {\"preset\": preset, \"preset_file\": preset_file,\n"
             "                                               \"files\": sorted(claimed), \"writing\": True})\n",
             "        pass\n", ("tests/test_report.py",)),
    Mutation("run-ignores-unread-settings", "config checks", "`fedvls run` starts a run with a typed setting no part "
             "of it reads (fedprox-mu with method fedavg), which it then ignores",
             "fedvls_flwr/experiments/run.py",
             "this_machine=True, warn=notes, typed=True)",
             "this_machine=True, warn=notes)", ("tests/test_check.py",)),
    Mutation("shm-file-left-to-the-parent", "engine", "only the parent removes a round's /dev/shm file (a system "
             "without memfd), after the reply: a parent killed mid-round leaves it in memory for good",
             "fedvls_flwr/ops/client_worker.py",
             "            if path != MEMFD_PATH:\n                Path(path).unlink(missing_ok=True)\n",
             "            pass\n", ("tests/test_client_workers.py",)),
    Mutation("shared-file-named-where-memfd-exists", "engine", "the workers' shared memory is a named /dev/shm file "
             "where anonymous memory (memfd) exists: a name that can be left behind, and Docker's 64 MiB /dev/shm caps it",
             "fedvls_flwr/ops/client_worker.py",
             'USE_MEMFD = hasattr(os, "memfd_create")', "USE_MEMFD = False", ("tests/test_client_workers.py",)),
    Mutation("reply-metrics-of-this-session", "results", "summary.json's reply_metrics lists only the last session's "
             "accepted replies: a resumed run hides what its earlier rounds' replies carried",
             "fedvls_flwr/app/server.py",
             "            \"reply_metrics\": sorted({name for r in rounds for name in r.get(\"reply_metrics\", ())}\n",
             "            \"reply_metrics\": sorted({name for r in rounds[-1:] for name in r.get(\"reply_metrics\", ())}\n",
             RESUME),
    Mutation("sweep-reruns-a-run-taken-meanwhile", "presets", "a sweep starts a run another sweep on the same folder "
             "finished while it waited: resumed with no round left, it rewrites that run's summary and model",
             "fedvls_flwr/experiments/sweep.py",
             "    if (output_dir / name / SUMMARY_FILE).exists():\n        statuses[name] = \"skipped (finished meanwhile",
             "    if False:\n        statuses[name] = \"skipped (finished meanwhile", ("tests/test_presets.py",)),
    Mutation("worker-ctrl-c-after-imports", "engine", "a client worker ignores Ctrl-C only once its imports are done: "
             "Ctrl-C in a run's first second prints its KeyboardInterrupt traceback",
             "fedvls_flwr/ops/client_worker.py",
             "WORKER_CODE = (\"import signal; signal.signal(signal.SIGINT, signal.SIG_IGN); import sys; \"\n",
             "WORKER_CODE = (\"import signal; import sys; \"\n", ("tests/test_client_workers.py",)),
    Mutation("aggregation-threads-inherited-by-a-fork", "aggregation", "a child forked after the server averaged "
             "on threads keeps its parent's thread pool, whose threads do not exist there: its next average waits forever",
             "fedvls_flwr/algorithms/aggregation.py",
             "os.register_at_fork(after_in_child=_forget_pool_in_child)\n",
             "\n", ("tests/test_aggregation.py",)),
    Mutation("aggregation-spans-by-thread-count", "aggregation", "the server's spans are cut by its thread count: "
             "the drift diagnostic of the same round differs between a 1-thread and a 3-thread server",
             "fedvls_flwr/algorithms/aggregation.py",
             "    spans = [(key, lo, min(ref.size, lo + SPAN)) for key, ref in arrays.items() "
             "for lo in range(0, max(ref.size, 1), SPAN)]\n",
             "    step = SPAN // torch.get_num_threads()\n"
             "    spans = [(key, lo, min(ref.size, lo + step)) for key, ref in arrays.items() "
             "for lo in range(0, max(ref.size, 1), step)]\n", ("tests/test_aggregation.py",)),
    Mutation("average-in-another-reply-order", "aggregation", "the span-wise average adds the replies last first: "
             "the global model differs in its last bits from the plain loop's (and from earlier versions' histories)",
             "fedvls_flwr/algorithms/aggregation.py",
             "        for values, weight in zip(flat[key], weights):",
             "        for values, weight in zip(flat[key][::-1], weights[::-1]):", AGG),
    Mutation("worker-reply-over-the-unread-one", "engine", "a worker writes every reply from the start of its "
             "shared-memory file: a queued message's reply overwrites the last one while the parent, late on a loaded "
             "machine, still copies it out - a client's metrics arrive with another client's arrays",
             "fedvls_flwr/ops/client_worker.py",
             "        layout = bulk.put_reply(frames.data)\n",
             "        layout = bulk.put(frames.data)\n", ("tests/test_client_workers.py",)),
    Mutation("reply-check-misses-a-span-end", "reply checks", "the values of a reply are checked span by span, "
             "each span one value short: a NaN at a span's last value (an array's last, say) is averaged in",
             "fedvls_flwr/algorithms/aggregation.py",
             "None if np.isfinite(flat[key][lo:hi]).all() else key",
             "None if np.isfinite(flat[key][lo:hi - 1]).all() else key", ("tests/test_aggregation.py",)),
    Mutation("fd-handover-leaves-the-socket-nonblocking", "engine", "the shared file goes to a worker through a socket "
             "object made under the app's socket.setdefaulttimeout: the connection turns non-blocking, its next read "
             "fails and a healthy worker is taken for gone",
             "fedvls_flwr/ops/client_worker.py",
             '        sock.settimeout(None)\n        try:\n            socket.send_fds(sock, [b"F"], [fd])\n'
             '        finally:\n            os.set_blocking(conn.fileno(), True)\n',
             '        socket.send_fds(sock, [b"F"], [fd])\n', ("tests/test_client_workers.py",)),
    Mutation("disk-cache-read-every-message", "engine", "a process that never loads the whole dataset (a client "
             "worker, a Ray actor) reads a node's data from the disk cache for every message: FedConcat's kept "
             "features are computed again every head round",
             "fedvls_flwr/data/node_data.py",
             "                _keep_answer(answer_key, (cache_generation(), None, cached))",
             "                pass", ("tests/test_node_data.py",)),
    Mutation("sweep-refused-run-said-as-failure", "presets", "a run whose folder another sweep took just before "
             "its ServerApp started is refused and reported as a failed run with a log to read, not as in use",
             "fedvls_flwr/experiments/sweep.py",
             '    return _held_by_another(output_dir, name, statuses, log)\n\n\ndef _said_done(',
             '    return False\n\n\ndef _said_done(', ("tests/test_presets.py",)),
    Mutation("resume-rewrites-a-finished-run", "checkpoint and resume", "resume=true of a run that finished all its rounds runs "
             "again with no round left and writes its final files as its own (wall_seconds of a fraction of a "
             "second, resumed_after_round the last round)",
             "fedvls_flwr/app/server.py",
             "        if cfg.resume and (done := already_finished(",
             "        if False and (done := already_finished(", RESUME),
    Mutation("sweep-claims-a-run-another-finished", "presets", "a run another sweep finished just before this one "
             "started it comes back completed (its ServerApp leaves it alone) and is reported as this sweep's run",
             "fedvls_flwr/experiments/sweep.py",
             "    if before is None or _summary_stamp(output_dir, name) != before:",
             "    if True:", ("tests/test_presets.py",)),
]
