"""The config tree: files, overrides, environment, errors."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from clawrl.cli import main
from clawrl.config import API_KEY_ENV, Config, ConfigError, load_config, parse_overrides

CONFIGS = sorted((Path(__file__).resolve().parents[2] / "configs").glob("*.toml"))


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_every_shipped_config_loads(path):
    config = load_config(path)
    assert isinstance(config, Config)


def test_shipped_example_matches_defaults():
    assert load_config(CONFIGS[0]).model_dump() == Config().model_dump()


def test_dotted_overrides_win_over_the_file(tmp_path):
    f = tmp_path / "run.toml"
    f.write_text('[server]\nport = 9000\nhost = "127.0.0.1"\n[engine]\nmax_batch_size = 4\n')
    config = load_config(
        f, parse_overrides(["--server.port", "30000", "--engine.max-batch-size=2", "--server.api-key", "123"])
    )
    assert config.server.port == 30000
    assert config.engine.max_batch_size == 2
    assert config.server.api_key.get_secret_value() == "123"


def test_api_key_from_environment_is_masked_when_written(tmp_path, monkeypatch):
    monkeypatch.setenv(API_KEY_ENV, "s3cret")
    monkeypatch.setenv("CLAWRL_VLLM_API_KEY", "vllm-s3cret")  # the key of an attached vLLM's port
    config = load_config(None, {"run_dir": str(tmp_path)})
    assert config.server.api_key.get_secret_value() == "s3cret"
    assert config.engine.vllm.api_key.get_secret_value() == "vllm-s3cret"
    written = config.write()
    assert "s3cret" not in written.read_text()
    monkeypatch.delenv("CLAWRL_VLLM_API_KEY")
    assert load_config(written).engine.vllm.api_key is None  # masked: given again by the environment


@pytest.mark.parametrize(
    "args", [["--server.nope", "1"], ["--server.port", "many"], ["--engine.max-batch-size", "0"]]
)
def test_bad_overrides_are_rejected(args):
    with pytest.raises(ValidationError):
        load_config(None, parse_overrides(args))


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--engine.kind", "vllm"], "needs engine.vllm.start = true or engine.vllm.url"),
        (["--engine.vllm.start", "true", "--engine.vllm.url", "http://x"], "not both"),
        (["--engine.kind", "vllm", "--engine.vllm.url", "http://x", "--train.lora.rank", "32"], "is 32"),
    ],
)
def test_vllm_settings_that_cannot_work_are_refused(args, needle):
    with pytest.raises(ValidationError, match=needle) as caught:
        load_config(None, parse_overrides(args))
    if "rank" in args[-2]:  # both numbers, and how to fix it
        assert "max_lora_rank = 16" in str(caught.value) and "--train.lora.rank to 16" in str(caught.value)


def test_malformed_options_and_files(tmp_path):
    with pytest.raises(ConfigError):
        parse_overrides(["server.port"])
    bad = tmp_path / "bad.toml"
    bad.write_text("[server\n")
    with pytest.raises(ConfigError):
        load_config(bad)


def test_cli_refuses_public_bind_without_key(tmp_path, capsys):
    code = main(["serve", "--run-dir", str(tmp_path / "run"), "--server.host", "0.0.0.0"])
    assert code == 2
    assert "without an API key" in capsys.readouterr().err


def test_cli_reports_unwritable_run_dir(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert main(["serve", "--run-dir", str(blocker / "run")]) == 2
    assert "cannot write the run folder" in capsys.readouterr().err


def test_cli_config_errors_exit_with_usage(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["serve", "--server.port", "many"])
    assert exc.value.code == 2
    assert "port" in capsys.readouterr().err


def test_a_new_run_folder_is_private_and_an_existing_one_keeps_its_mode(tmp_path):
    from clawrl.cli import prepare_run_dir

    new = Config(run_dir=tmp_path / "parent" / "run")
    prepare_run_dir(new)
    assert (new.run_dir.stat().st_mode & 0o777) == 0o700
    assert ((new.run_dir / "logs").stat().st_mode & 0o777) == 0o700
    existing = tmp_path / "shared"
    existing.mkdir()
    existing.chmod(0o755)
    prepare_run_dir(Config(run_dir=existing))
    assert (existing.stat().st_mode & 0o777) == 0o755


def test_fsdp_without_cuda_is_refused_at_start_with_the_reason(tmp_path, capsys):
    args = ["--run-dir", str(tmp_path / "run"), "--train.distributed.strategy", "fsdp"]
    assert main(["serve", *args]) == 2
    err = capsys.readouterr().err
    assert "'fsdp' needs CUDA GPUs" in err and "this machine has none" in err
    assert not (tmp_path / "run").exists()  # refused before anything was written
    assert main(["train", *args]) == 2


def test_dual_clip_must_exceed_one():
    with pytest.raises(ValidationError, match="dual_clip must be > 1"):
        Config.model_validate({"train": {"dual_clip": 0.5}})
    assert Config.model_validate({"train": {"dual_clip": 0}}).train.dual_clip == 0  # off


def test_an_unset_batch_gives_every_rank_a_sample_and_a_set_one_too_small_is_refused():
    assert Config().train.batch_size == 4
    ranks = {"distributed": {"num_processes": 8}}
    assert Config.model_validate({"train": ranks}).train.batch_size == 8  # the default, one per rank
    assert Config.model_validate({"train": {"batch_size": 12} | ranks}).train.batch_size == 12
    with pytest.raises(ValidationError, match=r"batch_size \(2\) must be at least .*num_processes \(8\)"):
        Config.model_validate({"train": {"batch_size": 2} | ranks})
