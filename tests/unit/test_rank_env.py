"""The one place that reads the process's role: torchrun's variables and the legacy --local-rank."""

import pytest

from mgpucli.distributed.env import RankEnv, read_rank_env
from mgpucli.errors import UsageError


def test_no_variables_is_a_single_process():
    assert read_rank_env({}) == RankEnv(0, 0, 1, 1)
    assert not read_rank_env({}).distributed


def test_torchrun_variables():
    env = read_rank_env({"RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2"})
    assert env == RankEnv(rank=3, local_rank=1, world_size=4, local_world_size=2)
    assert env.distributed and not env.is_main


def test_legacy_local_rank_argument_is_used_when_the_env_lacks_it():
    env = read_rank_env({"RANK": "1", "WORLD_SIZE": "2"}, legacy_local_rank=1)
    assert env.local_rank == 1


def test_environment_wins_over_the_legacy_argument():
    env = read_rank_env({"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0"}, legacy_local_rank=1)
    assert env.local_rank == 0


def test_missing_local_world_size_defaults_to_world_size():
    assert read_rank_env({"RANK": "0", "WORLD_SIZE": "2"}).local_world_size == 2


@pytest.mark.parametrize("environ, fragment", [
    ({"RANK": "3", "WORLD_SIZE": "2"}, "RANK=3 does not fit WORLD_SIZE=2"),
    ({"RANK": "0"}, "WORLD_SIZE is missing"),
    ({"WORLD_SIZE": "2"}, "RANK is missing"),
    ({"RANK": "x", "WORLD_SIZE": "2"}, "RANK='x' in the environment is not an integer"),
])
def test_inconsistent_variables_are_usage_errors(environ, fragment):
    with pytest.raises(UsageError) as info:
        read_rank_env(environ)
    assert fragment in str(info.value) and "unset" in str(info.value)


def test_legacy_argument_arrives_before_the_subcommand():
    from typer.testing import CliRunner

    from mgpucli.cli.app import app
    from mgpucli.distributed import env as env_mod

    result = CliRunner().invoke(app, ["--local-rank=1", "train", "--help"])
    assert result.exit_code == 0
    assert env_mod._legacy_local_rank == 1
    env_mod.set_legacy_local_rank(None)
    assert CliRunner().invoke(app, ["--local_rank=0", "train", "--help"]).exit_code == 0
    assert env_mod._legacy_local_rank == 0
    env_mod.set_legacy_local_rank(None)
