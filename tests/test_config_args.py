"""The strict key=value parser (fedvls_flwr.config.args): the same dict as Flower's
parse_config_args for every string Flower reads completely, an error naming the item for
every string Flower would read only in part (silently dropping the rest)."""

import pytest
from flwr.common.config import parse_config_args

from fedvls_flwr.config.args import parse_run_config_args, split_items
from fedvls_flwr.config.run_config import ConfigError

ACCEPTED = [
    "lr=0.1",
    "method='fedavg' dirichlet-beta=0.5",
    'method="fedavg"   lr=1e-3  use-dis=false',
    "run-name='a b c' seed=3",
    "data-dir='/tmp/x y' num-server-rounds=50",
    "a.b=1 a.c=2",
    "lr=inf",
    "",
    "   ",
    "x=-1 y=+2.5 z=true",
]


@pytest.mark.parametrize("text", ACCEPTED)
def test_same_result_as_flower_where_flower_reads_everything(text):
    assert parse_run_config_args([text]) == parse_config_args([text])


def test_several_arguments_combine_as_in_flower():
    args = ["lr=0.1 seed=1", "momentum=0.5"]
    assert parse_run_config_args(args) == parse_config_args(args) == {"lr": 0.1, "seed": 1, "momentum": 0.5}


def test_a_key_in_two_arguments_is_refused_as_one_given_twice_in_one():
    """Flower keeps the last silently; within one argument the key twice is refused - either way
    which value was meant cannot be told."""
    args = ["lr=0.1 seed=1", "lr=0.2"]
    assert parse_config_args(args) == {"lr": 0.2, "seed": 1}
    with pytest.raises(ConfigError, match=r"--run-config: 'lr' is given twice \('lr=0.1', then 'lr=0.2' in 'lr=0.2'\)"):
        parse_run_config_args(args)
    with pytest.raises(ConfigError, match="'lr' is given twice in 'lr=0.1 lr=0.2'"):
        parse_run_config_args(["lr=0.1 lr=0.2"])


@pytest.mark.parametrize("option, text, message", [
    ("--federation-config", "num-supernodes=abc",
     "--federation-config: num-supernodes=abc: 'num-supernodes' takes an integer >= 1 (the number of simulated "
     "SuperNodes), e.g. num-supernodes=10"),
    ("--run-config", "lr=abc", "--run-config: lr=abc: 'lr' takes a number, e.g. lr=0.01"),
    ("--run-config", "use-dis=maybe", "--run-config: use-dis=maybe: 'use-dis' takes true or false, e.g. use-dis=true"),
    ("--run-config", "data-dir=/data", "a string needs quotes: data-dir='/data'"),
])
def test_a_value_that_is_not_toml_is_told_what_its_key_takes(option, text, message):
    """A number is not fixed by quoting it: the message says what the key takes."""
    with pytest.raises(ConfigError) as refused:
        parse_run_config_args([text], option)
    assert message in str(refused.value)


def test_toml_file_as_in_flower(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text('method = "fedavg"\nlr = 0.5\n[section]\nkey = 1\n')
    assert parse_run_config_args([str(path)]) == parse_config_args([str(path)])
    with pytest.raises(ConfigError, match="does not exist"):
        parse_run_config_args([str(tmp_path / "missing.toml")])
    path.write_text("lr = \n")
    with pytest.raises(ConfigError, match=f"{path} is not valid TOML"):
        parse_run_config_args([str(path)])


@pytest.mark.parametrize(
    "text, flower, message",
    [
        ("lr=", {}, "'lr=' has no value"),
        ("lr", {}, "'lr' is not key=value"),
        ("lr=0.1 momentum", {"lr": 0.1}, "'momentum' after 'lr=0.1' is not key=value"),
        ("lr = 0.1", {}, "'lr' is not key=value: write lr=VALUE (no spaces around '=')"),
        ("method='fedavg'x", {"method": "fedavg"}, "'x' after \"method='fedavg'\""),
        ("=0.1", {}, "'=0.1' has no key before '='"),
        ("seed=1 lr= momentum=0.5", {"seed": 1, "momentum": 0.5}, "'lr=' after 'seed=1' has no value"),
    ],
)
def test_what_flower_drops_silently_is_an_error_naming_the_item(text, flower, message):
    assert parse_config_args([text]) == flower  # what plain `flwr run` uses: part of it, silently
    with pytest.raises(ConfigError) as err:
        parse_run_config_args([text])
    assert message in str(err.value)
    assert "drop it silently" in str(err.value)


def test_split_items_keeps_values_as_written():
    assert split_items("a=1 b='x y' c=\"z\"") == [("a", "1"), ("b", "'x y'"), ("c", '"z"')]


@pytest.mark.parametrize(
    "text, message",
    [
        ("data-dir=/tmp/x", "data-dir=/tmp/x is not a TOML key=value item (a string needs quotes: data-dir='/tmp/x')"),
        ("lr=0.1 lr=0.2", "'lr' is given twice"),
    ],
)
def test_values_flower_rejects_with_a_generic_message_are_named(text, message):
    with pytest.raises(Exception, match="invalid format"):  # Flower: no key named
        parse_config_args([text])
    with pytest.raises(ConfigError) as err:
        parse_run_config_args([text])
    assert message in str(err.value)
