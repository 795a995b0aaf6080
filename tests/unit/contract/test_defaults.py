"""One set of defaults: the package's and the Ansible roles' must agree."""

from __future__ import annotations

from pathlib import Path

import yaml

from hsextract.capture.embedded.config import ServeConfig
from hsextract.capture.sglang.config import SGLangLaunchConfig
from hsextract.contract import defaults
from hsextract.extract.config import ExtractConfig

ROLES = Path(__file__).resolve().parents[3] / "roles"


def role_defaults(role: str) -> dict[str, object]:
    loaded = yaml.safe_load((ROLES / role / "defaults" / "main.yml").read_text())
    assert isinstance(loaded, dict)
    return loaded


def test_configs_use_the_shared_defaults() -> None:
    assert ExtractConfig.model_fields["server"].default == f"http://127.0.0.1:{defaults.SERVER_PORT}"
    for model in (ExtractConfig, ServeConfig, SGLangLaunchConfig):
        assert model.model_fields["rid_prefix"].default == defaults.RID_PREFIX
    assert ServeConfig.model_fields["port"].default == SGLangLaunchConfig.model_fields["port"].default == defaults.SERVER_PORT
    assert SGLangLaunchConfig.model_fields["python"].default == defaults.ML_ENV_PYTHON
    assert SGLangLaunchConfig.model_fields["dump_dir"].default == defaults.DUMP_DIR


def test_extract_settings_the_deployment_repeats_agree() -> None:
    """hsextract's ExtractConfig holds these defaults; the extractor role and inventory/example repeat them, and the
    /dev/shm budget (playbooks/vars/deploy.yml) is sized from the inventory's hsx_concurrency and hsx_max_seq_len."""
    extractor = role_defaults("hsx_extractor")
    example = yaml.safe_load((ROLES.parent / "inventory" / "example" / "group_vars" / "all.yml").read_text())
    fields = ExtractConfig.model_fields
    assert extractor["hsx_extractor_concurrency"] == example["hsx_concurrency"] == fields["concurrency"].default == 256
    assert extractor["hsx_extractor_max_seq_len"] == example["hsx_max_seq_len"] == fields["max_seq_len"].default
    assert extractor["hsx_extractor_answer_grace_s"] == fields["answer_grace_s"].default
    assert extractor["hsx_extractor_stall_timeout_s"] == fields["stall_timeout_s"].default
    assert extractor["hsx_extractor_server_down_timeout_s"] == fields["server_down_timeout_s"].default
    assert extractor["hsx_extractor_format"] == example["hsx_output_format"] == fields["format"].default
    assert extractor["hsx_extractor_spot_check_every"] == fields["spot_check_every"].default == defaults.SPOT_CHECK_EVERY
    assert extractor["hsx_extractor_spot_check_max_mismatches"] == fields["spot_check_max_mismatches"].default


def test_ansible_defaults_agree() -> None:
    server, extractor = role_defaults("hsx_server"), role_defaults("hsx_extractor")
    assert server["hsx_server_port"] == defaults.SERVER_PORT
    assert server["hsx_server_dump_dir"] == extractor["hsx_extractor_dump_dir"] == defaults.DUMP_DIR
    assert extractor["hsx_extractor_server_url"] == f"http://127.0.0.1:{defaults.SERVER_PORT}"
    assert extractor["hsx_extractor_metrics_port"] == defaults.METRICS_PORT
    for role in ("hsx_server", "hsx_extractor", "hsx_container_env", "hsx_sglang_runtime"):
        ml_env = role_defaults(role)[f"{role}_ml_env"]
        assert f"{ml_env}/bin/python" == defaults.ML_ENV_PYTHON, role
