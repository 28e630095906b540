"""The cases of docs/reliability.md: every bad input through the command a user runs, and the
faults injected into real runs (as the tests that inject them). ``scripts/reliability_table.py``
runs them and writes the page; ``tests/test_reliability_table.py`` re-runs the fast ones.

An input case is a command line (``{tmp}`` = a fresh folder of the case, ``{data}`` = the
folder holding the real MNIST test split) and, where it needs one, a ``setup`` that writes
files into ``{tmp}`` first (not timed; a run folder is made by the real server code on a fake
Grid, in this process). ``fast`` marks the check-level cases whose command loads no dataset,
torch, Flower or Ray (each well under a second): CI compares those with the page.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from scripts.reliability_setups import (
    DIGITS,
    FEDCONCAT,
    GOOD_PRESET,
    bad_label_mnist,
    certificate_folder,
    damaged_summary,
    fedconcat_run_folder,
    finished_runs,
    held_run_folder,
    moved,
    no_ray,
    node_folders,
    preset,
    remove_frozen_file,
    run_folder,
    runs_for_report,
    same_seed_on_both_engines,
    stale_lock_run_folder,
    tear_line,
    truncate_checkpoint,
    truncate_frozen_file,
    write_file,
)

CHECK = ("-m", "fedvls_flwr", "check")
RUN = ("-m", "fedvls_flwr", "run")
SWEEP = ("-m", "fedvls_flwr.experiments.sweep")
DEPLOY = ("-m", "fedvls_flwr", "deploy", "local", "--insecure")
REPORT = ("-m", "fedvls_flwr", "report")
CERTS = ("-m", "fedvls_flwr", "deploy", "certs", "{tmp}/certs", "--host", "127.0.0.1", "--node", "site-3")
NO_RAY = (("RAY_ADDRESS", "127.0.0.1:9"),)
NO_GPU = (("CUDA_VISIBLE_DEVICES", ""),)  # a machine without a GPU, wherever the page is measured


@dataclass(frozen=True)
class Case:
    id: str
    input: str                   # what is wrong, as the table's first column says it
    args: tuple[str, ...]        # after `python`
    fast: bool = False
    setup: Callable[[Path], None] | None = None
    pick: str = ""               # a regex: the output lines to show (default: error/warning/note/ok lines)
    timeout: float = 300.0
    env: tuple[tuple[str, str], ...] = ()  # environment variables the command runs with (shown before it)


def check(case_id: str, what: str, run_config: str | None, *extra: str, fast: bool = True,
          setup: Callable[[Path], None] | None = None, pick: str = "", env: tuple[tuple[str, str], ...] = ()) -> Case:
    args = CHECK + (("--run-config", run_config) if run_config is not None else ()) + extra
    return Case(case_id, what, args, fast=fast, setup=setup, pick=pick, env=env)


def sweep(case_id: str, what: str, *args: str, fast: bool = True, setup: Callable[[Path], None] | None = None) -> Case:
    return Case(case_id, what, SWEEP + args, fast=fast, setup=setup)


def deploy(case_id: str, what: str, *args: str, setup: Callable[[Path], None] | None = None, pick: str = "",
           timeout: float = 300.0) -> Case:
    return Case(case_id, what, DEPLOY + args, setup=setup, pick=pick, timeout=timeout)


# ---- setups (not timed) ----------------------------------------------------------------------
def node_data(case_id: str, what: str, kind: str, pick: str = "") -> Case:
    """``deploy local`` with two --node-data folders, one round: the launcher lists both
    folders before it starts; an image that cannot be read stops that node's ClientApp."""
    run = ("--node-data", "{tmp}/good", "{tmp}/bad", "--classes", DIGITS, "--run-config",
           "num-server-rounds=1 local-epochs=1 min-fit-fraction=0.5 round-timeout=120.0")
    return deploy(case_id, what, *run, setup=node_folders(kind),
                  pick=pick or r"nothing started|failed: |rejected|\[deploy\] (run|round) ")


# ---- the input cases -------------------------------------------------------------------------
CASES: tuple[Case, ...] = (
    # --run-config syntax (what Flower's parser would drop silently)
    check("empty-value", '`--run-config "lr="`', "lr="),
    check("bare-key", '`--run-config "lr"` (bare key)', "lr"),
    check("bare-after", '`--run-config "lr=0.1 momentum"`', "lr=0.1 momentum"),
    check("spaces", '`--run-config "lr = 0.1"` (spaces around =)', "lr = 0.1"),
    check("unquoted", "unquoted string `data-dir=/data`", "data-dir=/data"),
    check("twice", "key given twice `lr=0.1 lr=0.2`", "lr=0.1 lr=0.2"),
    check("double-eq", "`method==`", "method=="),
    check("no-toml", "missing TOML file", "nope.toml"),
    # keys
    check("typo-lamda", "unknown key `lamda-dis`", "lamda-dis=0.1"),
    check("typo-rounds", "unknown key `num-server-round`", "num-server-round=3"),
    check("underscore", "unknown key `lambda_dis`", "lambda_dis=0.1"),
    check("synonym", "unknown key `learning-rate`", "learning-rate=0.1"),
    check("federation-key", "federation key in run config `num-supernodes=10`", "num-supernodes=10"),
    # types
    check("type-lr", "type: `lr='fast'`", "lr='fast'"),
    check("type-epochs", "type: `local-epochs=1.5`", "local-epochs=1.5"),
    check("type-bool", "type: `use-dis='maybe'`", "use-dis='maybe'"),
    check("type-method", "type: `method=3`", "method=3"),
    check("type-seed", "type: `seed=inf`", "seed=inf"),
    # ranges
    check("lr-neg", "`lr=-0.1`", "lr=-0.1"),
    check("lr-inf", "`lr=inf`", "lr=inf"),
    check("momentum-1", "`momentum=1.0`", "momentum=1.0"),
    check("momentum-nan", "`momentum=nan`", "momentum=nan"),
    check("wd-neg", "`weight-decay=-1`", "weight-decay=-1"),
    check("lambda-inf", "`lambda-dis=inf`", "lambda-dis=inf"),
    check("fedlc-tau", "`fedlc-tau=-1`", "fedlc-tau=-1"),
    check("fedntd-tau", "`fedntd-tau=0`", "fedntd-tau=0"),
    check("beta-0", "`dirichlet-beta=0`", "dirichlet-beta=0"),
    check("beta-inf", "`dirichlet-beta=inf`", "dirichlet-beta=inf"),
    check("fraction-1.5", "`fraction-train=1.5`", "fraction-train=1.5"),
    check("min-fit-2", "`min-fit-fraction=2`", "min-fit-fraction=2"),
    check("timeout-inf", "`round-timeout=inf`", "round-timeout=inf"),
    check("rounds-0", "`num-server-rounds=0`", "num-server-rounds=0"),
    check("batch-0", "`batch-size=0`", "batch-size=0"),
    check("seed-neg", "`seed=-1`", "seed=-1"),
    check("alpha-neg", "`synthetic-alpha=-1`", "synthetic-alpha=-1"),
    check("pool-neg", "`train-pool-size=-5`", "train-pool-size=-5"),
    check("min-nodes-timeout-0", "`min-nodes-timeout=0`", "min-nodes-timeout=0"),
    # choices
    check("method-typo", "unknown method `fedvsl`", "method='fedvsl'"),
    check("method-case", "method in capitals `FedVLS`", "method='FedVLS'"),
    check("dataset-typo", "dataset typo `fminst`", "dataset='fminst'"),
    check("method-fedprox", "method `fedprox`", "method='fedprox'", "--no-data"),
    check("dataset-unknown", "unknown dataset `imagenet`", "dataset='imagenet'"),
    check("model-unknown", "unknown model `vgg`", "model='vgg'"),
    check("partition-unknown", "unknown partition `label`", "partition='label'"),
    check("device-gpu", "`device='gpu'`", "device='gpu'"),
    check("teacher-mode", "`teacher-mode='frozen'`", "teacher-mode='frozen'"),
    check("resume-no-name", "`resume=true` without run-name", "resume=true"),
    check("run-name-slash", "`run-name='a/b'`", "run-name='a/b'"),
    check("pool-synthetic", "`dataset='synthetic' train-pool-size=100`", "dataset='synthetic' train-pool-size=100"),
    # the data and the split
    check("no-mnist10k", "missing dataset (mnist10k, wrong data-dir)", "dataset='mnist10k' data-dir='/nonexistent'",
          fast=False),
    check("no-cifar10", "missing dataset (cifar10)", "dataset='cifar10' data-dir='/nonexistent'", fast=False),
    check("bad-label", "dataset with a label out of range (mnist10k label 12)",
          "dataset='mnist10k' data-dir='{tmp}/badlabel'", fast=False, setup=bad_label_mnist),
    check("shards-500", "impossible split: 500 shards per client, 10 nodes", "partition='shards' shards-per-client=500",
          "--num-supernodes", "10", fast=False),
    check("min-size-1000", "impossible split: min-partition-size 1000, 10 nodes", "min-partition-size=1000",
          "--num-supernodes", "10", fast=False),
    check("synthetic-clients", "synthetic-clients != num-supernodes", "dataset='synthetic' synthetic-clients=100",
          "--num-supernodes", "10", fast=False),
    check("cuda", "`device='cuda'` (on a machine without CUDA: refused; with one: ok)", "device='cuda'", "--no-data",
          fast=False),
    check("mobilenetv2-digits", "`model='mobilenetv2'` on digits (8x8 images: its feature map collapses to 1x1)",
          "model='mobilenetv2'", "--num-supernodes", "4", fast=False),
    # this machine: the output folder and the run folder
    check("output-under-file", "`output-dir` under a file", "output-dir='{tmp}/afile/runs'", "--no-data",
          setup=write_file("afile", "x")),
    check("run-folder-taken", "run folder already holds a run (resume=false)", "output-dir='{tmp}/runs' run-name='ok'",
          "--no-data", fast=True, setup=run_folder("ok", 2)),
    check("resume-torn-covered", "resume, rounds.jsonl torn inside the checkpointed rounds",
          "output-dir='{tmp}/runs' run-name='torn' resume=true", "--no-data", fast=True,
          setup=run_folder("torn", 2, tear_line(covered=True))),
    check("resume-torn-last", "resume, rounds.jsonl torn after the checkpoint's round",
          "output-dir='{tmp}/runs' run-name='tornlast' resume=true", "--no-data", fast=True,
          setup=run_folder("tornlast", 2, tear_line(covered=False))),
    check("resume-truncated-ckpt", "resume, truncated checkpoint.npz",
          "output-dir='{tmp}/runs' run-name='ckpt' resume=true", "--no-data", fast=True,
          setup=run_folder("ckpt", 2, truncate_checkpoint)),
    Case("resume-frozen-missing", "`fedvls run` resuming a FedConcat run in its second stage whose "
         "`checkpoint-frozen-<digest>.npz` (the frozen encoders checkpoint.npz takes from it) is missing",
         RUN + ("--run-config", f"output-dir='{{tmp}}/runs' run-name='frozen' resume=true num-server-rounds=5 {FEDCONCAT}",
                "--federation-config", "num-supernodes=4 client-resources-num-cpus=1"), fast=True,
         setup=fedconcat_run_folder("frozen", 3, remove_frozen_file)),
    Case("resume-frozen-truncated", "`fedvls run` resuming a FedConcat run in its second stage whose "
         "`checkpoint-frozen-<digest>.npz` is truncated (checkpoint.npz intact)",
         RUN + ("--run-config", f"output-dir='{{tmp}}/runs' run-name='frozen' resume=true num-server-rounds=5 {FEDCONCAT}",
                "--federation-config", "num-supernodes=4 client-resources-num-cpus=1"), fast=True,
         setup=fedconcat_run_folder("frozen", 3, truncate_frozen_file)),
    check("resume-garbage-state", "resume, garbage state.json",
          "output-dir='{tmp}/runs' run-name='state' resume=true", "--no-data", fast=True,
          setup=run_folder("state", 2, lambda d: (d / "state.json").write_text("\x00garbage"))),
    check("resume-moved", "resume, folder moved to another output-dir",
          "output-dir='{tmp}/new' run-name='ok' resume=true num-server-rounds=4", "--no-data", fast=True,
          setup=moved),
    check("resume-missing", "`resume=true` of a run-name with no folder",
          "output-dir='{tmp}/runs' run-name='digits-fedvls-s1' resume=true", "--no-data", fast=True,
          setup=run_folder("digits-fedvls-s0", 2)),
    check("resume-other-lr", "resume with other settings (lr changed)",
          "output-dir='{tmp}/runs' run-name='ok' resume=true lr=0.5", "--no-data", fast=True,
          setup=run_folder("ok", 2)),
    # the federation's size and the fraction of it sampled
    check("min-nodes-above", "`min-nodes=6` on 4 nodes", "min-nodes=6", "--num-supernodes", "4", "--no-data"),
    check("rounds-1e9", "`num-server-rounds=1000000000`", "num-server-rounds=1000000000", "--num-supernodes", "10",
          fast=False),
    check("fraction-1e-9", "`fraction-train=1e-9`", "fraction-train=1e-9", "--no-data"),
    check("fraction-0.1-of-10", "`fraction-train=0.1` on 10 nodes", "fraction-train=0.1", "--num-supernodes",
          "10", "--no-data"),
    # presets and the sweep
    sweep("preset-federation-typo", "preset: federation `num-supernode`", "{tmp}/presets/fed-typo.yaml", "--dry-run",
          setup=preset(GOOD_PRESET + "federation: {num-supernode: 4}\n", "fed-typo")),
    sweep("preset-rows-typo", "preset: table `rows: [datset]`", "{tmp}/presets/rows-typo.yaml", "--dry-run",
          setup=preset(GOOD_PRESET + "table: {rows: [datset]}\n", "rows-typo")),
    sweep("preset-colums", "preset: table `colums:`", "{tmp}/presets/colums.yaml", "--dry-run",
          setup=preset(GOOD_PRESET + "table: {colums: [method]}\n", "colums")),
    sweep("preset-method-typo", "preset: unknown method `fedprx` in grid", "{tmp}/presets/fedprx.yaml", "--dry-run",
          setup=preset("name: p\nbase: {dataset: digits}\ngrid: {method: [fedprx]}\n", "fedprx")),
    sweep("preset-fedprox", "preset: method `fedprox` in grid", "{tmp}/presets/fedprox.yaml",
          "--dry-run", setup=preset("name: p\nbase: {dataset: digits}\ngrid: {method: [fedprox]}\n", "fedprox")),
    sweep("preset-bad-yaml", "preset: invalid YAML", "{tmp}/presets/badyaml.yaml", "--dry-run",
          setup=preset("name: p\nbase: {dataset: digits\ngrid: {method: [fedavg]}\n", "badyaml")),
    sweep("preset-missing", "preset: missing file", "{tmp}/presets/none.yaml", "--dry-run"),
    sweep("preset-empty-grid", "preset: empty grid list `method: []`", "{tmp}/presets/empty-grid.yaml", "--dry-run",
          setup=preset("name: p\nbase: {dataset: digits}\ngrid: {method: []}\n", "empty-grid")),
    sweep("preset-shards", "preset: impossible split (sweep without --dry-run, no SuperLink started)",
          "{tmp}/presets/shards.yaml", "-o", "{tmp}/out", fast=False,
          setup=preset("name: p\nbase: {dataset: digits, partition: shards, shards-per-client: 500}\n"
                       "grid: {method: [fedavg]}\nfederation: {num-supernodes: 10}\n", "shards")),
    sweep("sweep-summary-damaged", "sweep into a folder where a finished run's `summary.json` is damaged",
          "{tmp}/presets/p.yaml", "-o", "{tmp}/out",
          setup=damaged_summary),
    sweep("preset-min-nodes", "preset: `min-nodes: 5` on 3 nodes (no run started)",
          "{tmp}/presets/min-nodes.yaml", "-o", "{tmp}/out", fast=False,
          setup=preset("name: p\nbase: {dataset: digits, min-nodes: 5}\ngrid: {method: [fedavg]}\n"
                       "federation: {num-supernodes: 3}\n", "min-nodes")),
    sweep("set-empty", "sweep `--set lr=`", "conf/mnist10k-dir0.05.yaml", "--set", "lr=", "--dry-run"),
    sweep("set-bare", 'sweep `--set "lr=0.1 momentum"`', "conf/mnist10k-dir0.05.yaml", "--set", "lr=0.1 momentum",
          "--dry-run"),
    sweep("set-typo", "sweep `--set lamda-dis=0.2`", "conf/mnist10k-dir0.05.yaml", "--set", "lamda-dis=0.2", "--dry-run"),
    sweep("only-typo", "sweep `--only datset=digits`", "conf/mnist10k-dir0.05.yaml", "--only", "datset=digits",
          "--dry-run"),
    sweep("seeds-bad", "sweep `--seeds 0,one`", "conf/mnist10k-dir0.05.yaml", "--seeds", "0,one", "--dry-run"),
    # the one-machine deployment launcher (refuses before it starts anything)
    deploy("deploy-empty-value", 'deploy `--run-config "lr="`', "--nodes", "2", "--run-config", "lr="),
    deploy("deploy-fedprox", "deploy `--run-config \"method='fedprx'\"`", "--nodes", "2", "--run-config",
           "method='fedprx'"),
    deploy("deploy-partition-range", "deploy bad node config `partition-id=3 num-partitions=2`", "--nodes", "2",
           "--node-config", "partition-id=3 num-partitions=2", "--node-config", "partition-id=1 num-partitions=2"),
    deploy("deploy-node-config-empty", "deploy node config `partition-id=0 num-partitions=`", "--nodes", "1",
           "--node-config", "partition-id=0 num-partitions="),
    deploy("deploy-min-nodes", "deploy `--nodes 2 --run-config min-nodes=3`", "--nodes", "2", "--run-config",
           "min-nodes=3"),
    deploy("deploy-same-partition", "deploy: two SuperNodes given `partition-id=1`", "--nodes", "2",
           "--node-config", "partition-id=1 num-partitions=2", "--node-config", "partition-id=1 num-partitions=2"),
    # node-local data (deploy local --node-data)
    node_data("node-loop", "node data: a symbolic-link loop in a class folder", "loop"),
    node_data("node-stray-class", "node data: a class folder not in --classes", "stray-class"),
    node_data("node-one-class", "node data: a site holding one class only", "one-class"),
    node_data("node-other-files", "node data: non-image files mixed in", "other-files"),
    node_data("node-other-size", "node data: 50x40 images for the 8x8 digits model", "other-size"),
    node_data("node-dir-as-file", "node data: a directory named `x.png` in a class folder", "dir-as-file"),
    node_data("node-dangling", "node data: an unreadable image (a dangling symbolic link; root reads chmod 000 "
              "files, so this stands for one)", "dangling"),
    node_data("node-not-an-image", "node data: a `.png` that is not an image", "not-an-image"),
    # reports
    Case("report-missing", "report of a path that does not exist", REPORT + ("{tmp}/nope",), fast=True),
    Case("report-empty", "report of an empty folder", REPORT + ("{tmp}",), fast=True),
    Case("report-unfinished", "report of runs still going or failed", REPORT + ("{tmp}/runs",), fast=True,
         setup=runs_for_report, pick=r"^(error|  left out)"),
    # a simulation meant for a running Ray cluster (docs/ray-cluster.md); nothing listens at 127.0.0.1:9
    check("ray-address-unreachable", "`RAY_ADDRESS` that nothing answers", None, "--no-data", env=NO_RAY),
    check("ray-init-args-conflict", "federation `init-args-num-cpus` with `RAY_ADDRESS` set", None, "--no-data",
          "--federation-config", "num-supernodes=4 init-args-num-cpus=2", env=NO_RAY),
    Case("sweep-ray-unreachable", "sweep with a `RAY_ADDRESS` that nothing answers", SWEEP + (
        "bench/sweep-digits-small.yaml", "-o", "{tmp}/out"), env=NO_RAY),
    # the paper's last rows: FedMR, FedGF, FedConcat
    check("fedmr-deco-negative", "FedMR `fedmr-deco=-1`", "method='fedmr' fedmr-deco=-1", "--no-data"),
    check("fedgf-c-range", "FedGF `fedgf-c=1.5`", "local-optimizer='fedgf' fedgf-c=1.5", "--no-data"),
    check("fedgf-mode-typo", "FedGF `fedgf-c-mode='adaptiv'`", "local-optimizer='fedgf' fedgf-c-mode='adaptiv'",
          "--no-data"),
    check("fedconcat-fedadam", "FedConcat with `server-optimizer='fedadam'`",
          "protocol='fedconcat' server-optimizer='fedadam'", "--no-data"),
    check("fedconcat-fedgf", "FedConcat with `local-optimizer='fedgf'`",
          "protocol='fedconcat' local-optimizer='fedgf'", "--no-data"),
    check("fedconcat-logreg", "FedConcat with `model='logreg'`", "protocol='fedconcat' model='logreg'", "--no-data"),
    check("fedconcat-empty-cluster", "FedConcat `fedconcat-assignment='0,0,0,0'` leaves cluster 1 empty",
          "protocol='fedconcat' fedconcat-assignment='0,0,0,0'", "--no-data"),
    check("fedconcat-too-many-clusters", "FedConcat `fedconcat-clusters=8` on 4 nodes",
          "protocol='fedconcat' fedconcat-clusters=8", "--num-supernodes", "4", "--no-data"),
    check("fedconcat-assignment-short", "FedConcat `fedconcat-assignment='0,1'` on 4 nodes",
          "protocol='fedconcat' fedconcat-assignment='0,1'", "--num-supernodes", "4", "--no-data"),
    # an operator's CA, silent acceptances, defaults that diverge
    Case("certs-existing-ca", "`deploy certs` on a folder that already holds a CA", CERTS,
         setup=certificate_folder(), pick=r"already holds a CA|^CA (certificate|key)|^SuperNode site-3"),
    Case("certs-half-ca", "`deploy certs` on a folder holding `ca.pem` but not `ca.key`", CERTS,
         setup=certificate_folder("ca.key"), pick=r"nothing written"),
    sweep("preset-duplicate-key", "preset: `method` twice in grid", "{tmp}/presets/twice.yaml", "--dry-run",
          setup=preset("name: p\nbase: {dataset: digits}\ngrid:\n  method: [fedavg, fedprox, moon]\n"
                       "  method: [fedvls]\n", "twice")),
    sweep("sweep-timeout-negative", "sweep `--timeout -5`", "conf/mnist10k-dir0.05.yaml", "-o", "{tmp}/out",
          "--timeout", "-5"),
    sweep("sweep-output-file", "sweep `-o` an existing file", "conf/mnist10k-dir0.05.yaml", "-o", "{tmp}/afile",
          setup=write_file("afile", "x")),
    Case("report-rows-typo", "report `--rows datset`", REPORT + ("{tmp}/runs", "--rows", "datset"), fast=True,
         setup=finished_runs()),
    Case("report-gap-typo", "report `--gap FedVLS:FedAvgg`", REPORT + ("{tmp}/runs", "--gap", "FedVLS:FedAvgg"),
         fast=True, setup=finished_runs()),
    Case("report-rounds-last-line", "report of a complete run whose `rounds.jsonl` lost its last line",
         REPORT + ("{tmp}/runs",), fast=True, setup=finished_runs("last-line"), pick=r"^(error|warning|left out)"),
    Case("report-rounds-missing", "report of a complete run without `rounds.jsonl`",
         REPORT + ("{tmp}/runs",), fast=True, setup=finished_runs("missing"), pick=r"^(error|warning|left out)"),
    check("federation-key-typo", "`--federation-config` key typo `num-supernode=2`", None, "--no-data",
          "--federation-config", "num-supernode=2"),
    check("federation-zero-nodes", "`--federation-config` with `num-supernodes=0`", None, "--no-data",
          "--federation-config", "num-supernodes=0"),
    check("part-setting-unselected", "`fedconcat-assignment='0,1'` without `protocol='fedconcat'`",
          "fedconcat-assignment='0,1'", "--no-data"),
    check("resume-fewer-rounds", "resume a finished 4-round run with `num-server-rounds=2`",
          "output-dir='{tmp}/runs' run-name='ok' resume=true num-server-rounds=2", "--no-data",
          setup=run_folder("ok", 4, finished=True)),
    check("resume-finished", "resume a finished 4-round run with the same `num-server-rounds=4`",
          "output-dir='{tmp}/runs' run-name='ok' resume=true num-server-rounds=4", "--no-data",
          setup=run_folder("ok", 4, finished=True)),
    check("fedgf-adaptive-no-threshold", "FedGF `fedgf-c-mode='adaptive'` without `fedgf-threshold`",
          "local-optimizer='fedgf' fedgf-c-mode='adaptive'", "--no-data"),
    # one run folder, one run; what no machine can serve; keys twice; an installed package's view
    check("run-folder-held", "a run folder another run holds now (its lock)", "output-dir='{tmp}/runs' run-name='going'",
          "--no-data", setup=held_run_folder("going", 2)),
    check("resume-still-going", "`resume=true` of a run that is still going",
          "output-dir='{tmp}/runs' run-name='going' resume=true", "--no-data", setup=held_run_folder("going", 2)),
    Case("run-folder-stale-lock", "`fedvls run` resuming a folder whose run was killed while it held it (stale lock)",
         RUN + ("--run-config", "output-dir='{tmp}/runs' run-name='killed' resume=true num-server-rounds=3",
                "--federation-config", "num-supernodes=3 client-resources-num-cpus=1"),
         setup=stale_lock_run_folder("killed", 2), pick=r"took over|^done: |^error"),
    check("gpu-share-no-gpu", "`client-resources-num-gpus=0.25` on a machine without a GPU", None, "--no-data",
          "--federation-config", "num-supernodes=10 client-resources-num-cpus=1 client-resources-num-gpus=0.25",
          env=NO_GPU),
    check("cpus-above-cores", "`client-resources-num-cpus=4096`, more than the machine's cores", None, "--no-data",
          "--federation-config", "num-supernodes=4 client-resources-num-cpus=4096", fast=False),
    Case("run-cpus-fraction", "`fedvls run` with `client-resources-num-cpus=0.5`",
         RUN + ("--federation-config", "num-supernodes=4 client-resources-num-cpus=0.5"), fast=True),
    Case("run-cpus-above-cores", "`fedvls run` with `client-resources-num-cpus=4096`, more than the machine's cores",
         RUN + ("--federation-config", "num-supernodes=4 client-resources-num-cpus=4096")),
    Case("run-gpu-share-no-gpu", "`fedvls run` with `client-resources-num-gpus=0.25` on a machine without a GPU",
         RUN + ("--federation-config", "num-supernodes=4 client-resources-num-gpus=0.25"), fast=True, env=NO_GPU),
    check("run-config-twice-across", "a key in two arguments `--run-config lr=0.1 --run-config lr=0.2`", "lr=0.1",
          "--run-config", "lr=0.2", "--no-data"),
    check("federation-value-not-number", "`--federation-config num-supernodes=abc`", None, "--no-data",
          "--federation-config", "num-supernodes=abc"),
    sweep("sweep-progress-negative", "sweep `--progress-every -1`", "conf/mnist10k-dir0.05.yaml", "--progress-every",
          "-1", "--dry-run"),
    sweep("sweep-seeds-empty", "sweep `--seeds ''`", "conf/mnist10k-dir0.05.yaml", "--seeds", "", "--dry-run"),
    sweep("sweep-seeds-repeated", "sweep `--seeds 0,0`", "conf/mnist10k-dir0.05.yaml", "--seeds", "0,0", "--dry-run"),
    sweep("preset-base-run-name", "preset: `base` sets `run-name` (every run one folder)", "{tmp}/presets/named.yaml",
          "--dry-run", setup=preset("name: p\nbase: {dataset: digits, run-name: same}\n"
                                    "grid: {method: [fedavg, fedvls]}\n", "named")),
    Case("sweep-flwr-no-ray", "sweep `--engine flwr` where Ray cannot be imported", SWEEP + (
        "conf/mnist10k-dir0.05.yaml", "-o", "{tmp}/out", "--engine", "flwr"), fast=True, setup=no_ray,
        env=(("PYTHONPATH", "{tmp}/shadow"),)),
    Case("report-seed-both-engines", "report of one seed run by both engines (and an older version)",
         REPORT + ("{tmp}/runs",), fast=True, setup=same_seed_on_both_engines, pick=r"^(error|warning|left out)"),
    # a good config
    check("good", "a good config (digits, with data and split)", "method='fedavg'", "--num-supernodes", "10",
          fast=False),
    check("good-mnist10k", "a good config on the real mnist10k (with data and split)",
          "method='fedavg' dataset='mnist10k' data-dir='{data}'", "--num-supernodes", "10", fast=False),
)


@dataclass(frozen=True)
class Fault:
    id: str
    fault: str
    test: str      # the pytest node id that injects it and asserts what happens
    happens: str   # what the test asserts


FAULTS: tuple[Fault, ...] = (
    Fault("min-nodes-simulation", "`flwr run` (simulation, 4 SuperNodes) with `min-nodes=6`",
          "tests/test_e2e_reliability.py::test_min_nodes_above_the_simulation_fails_at_once",
          "the run fails within seconds: `min-nodes = 6 but this simulation has 4 SuperNode(s)` in the log; "
          "no Flower or Ray process is left (no `waiting for nodes` every 30 s, no orphan `flwr-simulation` "
          "with its Ray processes once the SuperLink is stopped)"),
    Fault("raise-nan", "a client raises (round 1), a client sends NaN weights (round 2)",
          "tests/test_e2e_reliability.py::test_raising_and_nan_clients_are_dropped_and_recorded",
          "each left out of its round and recorded in `rounds.jsonl` with its reason; the run completes"),
    Fault("server-killed", "server SIGKILLed after round 2 of 6",
          "tests/test_e2e_reliability.py::test_killed_server_resumes_with_every_round_once",
          "`resume=true` continues after the last saved round; rounds 0..6 each once"),
    Fault("invalid-value", "invalid value through `flwr run` (`dirichlet-beta=-1`)",
          "tests/test_e2e_reliability.py::test_invalid_run_config_fails_the_run_with_the_key_named",
          "the run fails; `flwr log` shows `'dirichlet-beta' = -1.0: must be > 0`"),
    Fault("unknown-key", "unknown key through `flwr run`",
          "tests/test_e2e_reliability.py::test_unknown_key_is_named_only_in_the_superlink_log_and_by_check",
          "`[code: 15] Invalid run configuration.`; the SuperLink log names it; `check` names it with a did-you-mean"),
    Fault("moved-folder", "run stopped after 2 rounds, folder moved to another `output-dir`, resumed to 4",
          "tests/test_e2e_reliability.py::test_moved_run_folder_resumes_bit_identical_to_an_uninterrupted_run",
          "completes; rounds and final model equal to an uninterrupted run, bit for bit"),
    Fault("supernode-killed", "SuperNode SIGKILLed mid-run (deployment)",
          "tests/test_e2e_deployment_faults.py::test_killed_supernode_run_continues_with_the_others",
          "the run continues with the other nodes and completes"),
    Fault("supernode-late", "SuperNode joins after round 1 (deployment)",
          "tests/test_e2e_deployment_faults.py::test_late_supernode_is_used_from_a_later_round",
          "used from a later round on"),
    Fault("sweep-killed", "a sweep killed after its first run, run again",
          "tests/test_e2e_sweep.py::test_sweep_killed_after_its_first_run_resumes_without_rerunning_it",
          "the finished run is skipped untouched, the rest runs"),
    Fault("sweep-sigterm", "`kill` (SIGTERM) to a sweep mid-run",
          "tests/test_e2e_sweep.py::test_sweep_stopped_by_sigterm_stops_everything_it_started",
          "exit 143; the sweep says it was `stopped by SIGTERM; every process it started has been stopped`, and its "
          "SuperLink, simulation and Ray head are gone"),
    Fault("fedconcat-late-node", "SuperNode joins FedConcat in stage 2 (deployment)",
          "tests/test_e2e_fedconcat.py::test_a_node_that_joins_in_stage_two_gets_the_encoders",
          "it is sent the K encoders and trains the head; no reply fails"),
    Fault("min-nodes-deployment", "a deployment short of `min-nodes` (fake Grid, no Flower processes)",
          "tests/test_strategy.py::test_a_deployment_short_of_min_nodes_fails_after_min_nodes_timeout_naming_the_partitions",
          "after `min-nodes-timeout` the run fails: `only 3 of min-nodes = 5 SuperNodes connected ...; they say "
          "partition id(s) 0, 2, 3; if the partitions are numbered 0..4, the missing ones are 1, 4`"),
    Fault("same-partition", "two SuperNodes say the same partition id (fake Grid)",
          "tests/test_strategy.py::test_two_supernodes_of_one_partition_are_not_averaged_twice",
          "the second reply of that partition is rejected in `rounds.jsonl`: `partition 1 is also node 12's: two "
          "SuperNodes were given the same partition-id ...`"),
    Fault("failure-names-partition", "a client raises / never replies (fake Grid)",
          "tests/test_strategy.py::test_failures_name_the_partition_of_the_node",
          "the failure in `rounds.jsonl` names the node and its partition"),
    Fault("enospc", "`ENOSPC` writing `checkpoint.npz` / `rounds.jsonl` / `state.json` in round 3 of 4",
          "tests/test_resume.py::test_full_disk_in_round_3_names_the_file_and_loses_nothing",
          "`could not write <path>: No space left on device. The results up to round 2 of 4 are complete and safe "
          "...`; resume matches the uninterrupted run"),
    Fault("enospc-final", "`ENOSPC` writing `model_final.npz` / `config.json`",
          "tests/test_resume.py::test_full_disk_at_the_final_files tests/test_resume.py::test_full_disk_before_any_round",
          "`All 4 rounds are complete and safe ... To write them: ...` / `No round had been completed ...`"),
    Fault("enospc-then-failed-round", "`ENOSPC` writing round 2's checkpoint (on the thread that writes it beside "
          "round 3), then round 3 gets no replies",
          "tests/test_resume.py::test_a_full_disk_then_a_failed_round_reports_the_disk_and_the_round_that_is_safe",
          "the run stops with `could not write <path>: No space left on device. The results up to round 1 of 4 are "
          "complete and safe ...`, round 3's failure logged beside it; `summary.json` says round 1; resume matches "
          "the uninterrupted run"),
    Fault("enospc-frozen", "`ENOSPC` writing `checkpoint-frozen-<digest>.npz` (FedConcat's first head round, round "
          "3 of 5); a second frozen file that cannot be written beside the one the last checkpoint names",
          "tests/test_resume.py::test_a_full_disk_writing_the_frozen_file_keeps_the_last_checkpoint_and_resumes "
          "tests/test_resume.py::test_a_full_disk_writing_a_new_frozen_file_leaves_the_last_checkpoint_and_its_frozen_file",
          "`could not write <run>/checkpoint-frozen-<digest>.npz: No space left on device. The results up to round 2 "
          "of 5 are complete and safe ...`; no half-written frozen or temp file; the last checkpoint (and the frozen "
          "file it names) unchanged and loadable; resume matches the uninterrupted run"),
    Fault("error-while-writing", "round 3 fails while round 2's files are still being written",
          "tests/test_resume.py::test_an_error_while_a_round_is_written_counts_that_round_once_written",
          "the run waits for round 2's files; `summary.json` and `state.json` say round 2; resume matches the "
          "uninterrupted run"),
    Fault("torn-last", "torn last line of `rounds.jsonl` after the checkpoint's round",
          "tests/test_resume.py::test_torn_last_line_of_rounds_after_the_checkpoint_is_dropped",
          "dropped with a warning naming the file; that round re-run; bit-identical"),
    Fault("damaged-refused", "`rounds.jsonl` torn inside the checkpointed rounds; truncated `checkpoint.npz`; "
          "`state.json` and checkpoint disagree",
          "tests/test_resume.py::test_torn_line_the_checkpoint_covers_is_named tests/test_resume.py::"
          "test_truncated_checkpoint_is_named tests/test_resume.py::test_inconsistent_state_and_checkpoint_are_refused",
          "refused, naming the file and what to do"),
    Fault("frozen-damaged-refused", "the frozen file FedConcat's checkpoint names missing / truncated, at the "
          "server's resume (`flwr run`'s path)",
          "tests/test_resume.py::test_a_missing_or_damaged_frozen_file_ends_the_resume_naming_it_and_changes_nothing",
          "refused naming that file (`resume: <run>/checkpoint-frozen-<digest>.npz is missing` / `is damaged "
          "(BadZipFile: ...); <run>/checkpoint.npz, which is intact, ...`) and what to do; no file of the run folder "
          "changes; with the file restored the resume matches the uninterrupted run"),
    Fault("two-runs-one-folder", "two `fedvls run` started together on one `output-dir`/`run-name`, other settings",
          "tests/test_e2e_run_refusals.py::test_two_fedvls_runs_started_together_on_one_folder_one_runs_the_other_is_refused",
          "one completes; the other exits 2 before any round: `run folder ... is in use by another run (pid ... on host "
          "..., started ..., command: ...)`; summary.json is the first run's"),
    Fault("flwr-run-held-folder", "`flwr run` on a run folder another process holds",
          "tests/test_e2e_run_refusals.py::test_flwr_run_on_a_folder_another_run_holds_is_refused_naming_it",
          "the run fails before it writes anything, naming the holder's pid; once the holder is killed its lock is "
          "stale and taken over"),
    Fault("gpu-share-simulation", "`flwr run` with `client-resources-num-gpus=0.25` on a machine without a GPU",
          "tests/test_e2e_run_refusals.py::test_a_gpu_share_where_there_is_no_gpu_fails_the_simulation_before_round_1",
          "the ServerApp fails the run before round 1: `client-resources-num-gpus = 0.25 gives every simulated client "
          "a share of a GPU, but this machine has no GPU ...` (not Flower's `ActorPool is empty` traceback)"),
    Fault("client-worker-killed", "a client worker SIGKILLed while it trains round 2 of 4 (`fedvls run`, "
          "2 workers, 4 nodes; as the out-of-memory killer kills it)",
          "tests/test_e2e_client_workers.py::test_a_killed_worker_fails_the_client_it_held_and_the_run_goes_on",
          "round 2 records that client as failed (`the client worker process (pid ...) was killed by SIGKILL while it "
          "ran this train message`), the other 3 accepted; the worker is started again (4 accepted from round 3); "
          "the run completes"),
    Fault("client-worker-killed-retried", "the same, with `round-retries=1` and `min-fit-fraction=1.0`",
          "tests/test_e2e_client_workers.py::"
          "test_a_round_retried_after_a_killed_worker_computes_what_an_undisturbed_run_computes",
          "the round is trained again (attempts 2); every round's accuracy and loss, the final model and the "
          "checkpoint equal an undisturbed run's, bit for bit"),
    Fault("gpu-context-broken", "a client's CUDA context breaks (a device-side assert; simulated on the CPU) on "
          "a client worker, another message queued behind it",
          "tests/test_client_workers.py::test_a_worker_whose_gpu_context_broke_fails_only_its_message_and_is_replaced",
          "only that client's reply fails (the ClientApp's error); a fresh worker serves the queued message and the "
          "next round; the node's state is the one before"),
    Fault("client-worker-killed-idle", "a client worker SIGKILLed between two rounds, while idle (1 worker, "
          "2 nodes)", "tests/test_client_workers.py::test_a_worker_killed_while_idle_fails_no_message_and_is_started_again",
          "no client fails: the message handed to the dead worker goes to a fresh one; the pool records the crash "
          "(`... before it took this train message`); every node counts on"),
    Fault("client-reply-refused", "a ClientApp on a client worker replies a value Flower refuses (a metric list "
          "changed after Flower checked it)",
          "tests/test_client_workers.py::test_a_reply_the_server_refuses_fails_the_run_as_without_workers_and_the_pool_goes_on",
          "the server raises Flower's TypeError at once, as when the client runs in the server's process (no round "
          "waits for the reply until round-timeout); the pool serves the next run"),
    Fault("client-pool-thread-error", "an unforeseen error in the server's own handling of a client worker's "
          "reply (planted)",
          "tests/test_client_workers.py::test_an_error_in_the_pools_own_thread_fails_the_message_and_replaces_the_worker",
          "that client's reply fails naming the error (`CLIENT_APP_CRASHED`), its node's state stays as it was, a "
          "fresh worker serves the next round; no message is left without a reply"),
    Fault("ctrl-c-run", "Ctrl-C (SIGINT to the process group) in `fedvls run` after a saved round",
          "tests/test_e2e_sweep.py::test_ctrl_c_stops_fedvls_run_with_one_line_and_its_command_continues_the_run",
          "exit 130, no traceback, one line: `stopped by Ctrl-C (SIGINT); rounds 1-N are saved in ...; to "
          "continue after round N: <the fedvls run command>`; that command, pasted, completes the run, every round once"),
    Fault("ctrl-c-sweep", "Ctrl-C (SIGINT to the process group) in `fedvls sweep` mid-run",
          "tests/test_e2e_sweep.py::test_ctrl_c_stops_a_sweep_with_one_line_saying_what_is_kept",
          "exit 130, no traceback, one line: `stopped by Ctrl-C (SIGINT); 0 of 2 runs are finished in "
          "...; to continue ...: <the same fedvls sweep command>`; its worker is gone"),
    Fault("installed-wheel", "`fedvls check`, `run` and `sweep` from the installed wheel, outside the source tree",
          "tests/test_e2e_entry_points.py::test_the_installed_wheel_checks_runs_and_sweeps_from_another_folder",
          "each works (exit 0) with the declared defaults; the package imported is the installed one"),
    Fault("repaired", "garbage `state.json`; state one round behind the checkpoint; garbage `config.json` with a "
          "`summary.json`",
          "tests/test_resume.py::test_garbage_state_is_repaired_from_checkpoint_and_rounds tests/test_resume.py::"
          "test_state_one_round_behind_the_checkpoint_continues_after_the_checkpoint tests/test_resume.py::"
          "test_garbage_config_json",
          "repaired from the other files with a warning (the two `state.json` cases then resume bit-identically)"),
)
