"""FedConcat's two stages over every round count 2..2000, checked exhaustively against the rule
written plainly here: a setting > 0 is stage 1's length as given; 0 is the authors' 1 : 20
split, round(R / 21) clamped to [1, R - 1]; either way each stage has at least one round. The
protocol's stage(round) switches exactly after stage 1's last round, for K = 2 and K = 4
clusters; the run config accepts exactly the settings that leave both stages a round."""

from __future__ import annotations

import pytest

from fedvls_flwr.algorithms.fedconcat import FedConcat, encoder_rounds
from fedvls_flwr.algorithms.parts import RunContext
from fedvls_flwr.algorithms.rounds import build_protocol
from fedvls_flwr.config.run_config import ConfigError, RunConfig, parse_run_config

ROUND_COUNTS = range(2, 2001)


def authors_split(num_rounds: int) -> int:
    """round(R / 21) in integers (R / 21 is never exactly halfway), clamped to [1, R - 1]."""
    nearest = (2 * num_rounds + 21) // 42
    return min(num_rounds - 1, max(1, nearest))


def test_the_default_split_is_one_to_twenty_with_a_round_in_each_stage_at_every_round_count():
    for n in ROUND_COUNTS:
        e = encoder_rounds(n, 0)
        assert e == authors_split(n), n
        assert 1 <= e <= n - 1, n
    # the authors' run: 50 encoder rounds + 1000 head rounds
    assert encoder_rounds(1050, 0) == 50


def test_a_positive_setting_is_stage_ones_length_as_given():
    for n in ROUND_COUNTS:
        for setting in {1, 2, n // 3, n // 2, n - 2, n - 1} - {0}:
            assert encoder_rounds(n, setting) == setting, (n, setting)


def protocol(num_rounds: int, clusters: int, setting: int) -> FedConcat:
    cfg = RunConfig(protocol="fedconcat", num_server_rounds=num_rounds, seed=3, fedconcat_clusters=clusters,
                    fedconcat_encoder_rounds=setting)
    built = build_protocol(cfg.to_flower(), RunContext(cfg))
    assert isinstance(built, FedConcat)
    return built


@pytest.mark.parametrize("clusters", [2, 4])
def test_the_stage_switches_right_after_stage_ones_last_round(clusters):
    for n in ROUND_COUNTS:
        for setting in (0, 1, n - 1):
            if setting >= n:
                continue
            p = protocol(n, clusters, setting)
            last = setting or authors_split(n)
            rounds = range(1, n + 1) if n <= 120 else (1, last, last + 1, n)
            stages = {r: p.stage(r) for r in rounds}
            assert stages == {r: 1 if r <= last else 2 for r in rounds}, (n, setting)
            assert p.round_info(last) == {"stage": 1} and p.round_info(last + 1) == {"stage": 2}
            assert p.stage(1) == 1 and p.stage(n) == 2


def test_the_run_config_accepts_exactly_the_settings_that_leave_each_stage_a_round():
    cases = [(n, s) for n in range(1, 61) for s in range(-1, n + 2)]
    cases += [(n, s) for n in (999, 1050, 2000) for s in (-1, 0, 1, n - 1, n, n + 1)]
    for n, s in cases:
        config = {"protocol": "fedconcat", "num-server-rounds": n, "fedconcat-encoder-rounds": s}
        if n >= 2 and 0 <= s < n:
            cfg = parse_run_config(config)
            assert 1 <= encoder_rounds(cfg.num_server_rounds, cfg.fedconcat_encoder_rounds) <= n - 1
        else:
            with pytest.raises(ConfigError):
                parse_run_config(config)
