"""The memory plan before launch (mas.learning.memory_plan, `mas validate --plan`): each part
against sizes computed by hand for a tiny model, the peak, the advice, and the command."""

from __future__ import annotations

import pytest
import yaml
from team_helpers import team_config
from transformers import AutoConfig

from mas.cli import main
from mas.config.schema import validate_config
from mas.learning.memory_plan import ACTIVATION_ELEMENTS, LOGIT_COPIES, DevicePlan, GiB, parse_device, plan_run


def tiny_shape(model_dir):
    c = AutoConfig.from_pretrained(model_dir)
    head_dim = c.hidden_size // c.num_attention_heads
    kv = getattr(c, "num_key_value_heads", None) or c.num_attention_heads
    return c, head_dim, kv


def parameters(model_dir) -> int:
    from transformers import AutoModelForCausalLM

    return sum(p.numel() for p in AutoModelForCausalLM.from_pretrained(model_dir).parameters())


def test_the_parts_of_a_full_policy_by_hand(tiny_model_dir):
    cfg = validate_config(team_config(tiny_model_dir, "chain"))
    plans = plan_run(cfg, device="cuda:1GB", prompt_tokens=100)
    assert [(d.device, d.capacity) for d in plans] == [("cuda", GiB)] and plans[0].overhead == 0  # a GPU: no host baseline
    main_plan = next(p for p in plans[0].policies if p.name == "main")
    n = parameters(tiny_model_dir)
    c, head_dim, kv = tiny_shape(tiny_model_dir)
    assert (main_plan.parameters, main_plan.trainable) == (n, n)
    assert main_plan.weights == 4 * n and main_plan.gradients == 4 * n and main_plan.optimizer == 8 * n  # float32, AdamW
    tokens = cfg.policies["main"].optim.micro_batch_tokens  # 4096 by default
    act = tokens * c.num_hidden_layers * c.hidden_size * ACTIVATION_ELEMENTS * 4
    logits = tokens * c.vocab_size * 4 * LOGIT_COPIES
    assert main_plan.pass_plain == act + logits
    assert main_plan.pass_saved == act + logits  # a tiny pass fits its budget: no saver
    rows = cfg.trainer.batch_size * cfg.trainer.group_size  # every episode of a step asks at once
    new = max(a.sampling.max_new_tokens for a in cfg.agents if a.policy == "main")
    kv_token = 2 * c.num_hidden_layers * kv * head_dim * 4  # keys and values of a position, float32
    prefill = rows * 100 * 4 * (2 * c.num_hidden_layers * kv * head_dim + 8 * c.hidden_size + 6 * c.intermediate_size)
    decode = rows * (100 + new) * kv_token + rows * new * c.vocab_size * 4  # the cache, and the logits generate keeps
    assert main_plan.generation == max(prefill, decode)  # one generate call of every episode's request
    judge = next(p for p in plans[0].policies if p.name == "judge")
    assert judge.trainable == 0 and judge.gradients == judge.optimizer == 0 and judge.pass_plain is None
    # the peak: what stays, plus the larger transient of one policy (an update or a rollout)
    resident = main_plan.weights + main_plan.optimizer + judge.weights
    transient = max(main_plan.gradients + main_plan.pass_saved, main_plan.generation, judge.generation)
    assert plans[0].peak() == resident + transient and plans[0].fits


def test_a_lora_family_counts_its_base_once_and_its_adapters_in_float32(tiny_model_dir):
    data = team_config(tiny_model_dir, "chain")
    data["policies"] = {
        "main": {"kind": "lora", "model": str(tiny_model_dir), "device": "cpu", "lora": {"r": 2, "target_modules": ["q_proj", "v_proj"]}},
        "judge": {"kind": "lora", "model": str(tiny_model_dir), "device": "cpu", "lora": {"r": 4, "target_modules": ["q_proj"]}},
    }
    cfg = validate_config(data)
    (plan,) = plan_run(cfg, device="cpu:2GB")[0].policies
    c, head_dim, kv = tiny_shape(tiny_model_dir)
    q_out, v_out = c.num_attention_heads * head_dim, kv * head_dim
    main = c.num_hidden_layers * 2 * ((c.hidden_size + q_out) + (c.hidden_size + v_out))
    judge = c.num_hidden_layers * 4 * (c.hidden_size + q_out)
    base = parameters(tiny_model_dir)
    assert plan.name == "main+judge" and plan.trainable == main + judge and plan.parameters == base + main + judge
    assert plan.weights == 4 * base + 4 * (main + judge)  # a float32 base here; adapters float32 always
    assert plan.optimizer == 8 * (main + judge) and plan.gradients == 4 * max(main, judge)  # one adapter updates at a time


def test_sharding_divides_the_state_and_rank_0_keeps_a_serving_copy(tiny_model_dir):
    data = team_config(tiny_model_dir, "chain")
    data["policies"]["main"].update(workers=4, sharding="fsdp")
    data["runtime"] = {"kind": "ray"}
    plain = next(p for p in plan_run(validate_config(team_config(tiny_model_dir, "chain")), device="cuda:1GB")[0].policies
                 if p.name == "main")
    sharded = next(p for p in plan_run(validate_config(data), device="cuda:1GB")[0].policies if p.name == "main")
    assert sharded.sharded and sharded.weights == -(-plain.weights // 4) and sharded.optimizer == -(-plain.optimizer // 4)
    assert sharded.serving == plain.weights and any("serving copy" in n for n in sharded.notes)


def test_a_config_that_does_not_fit_gets_the_advice(tiny_model_dir, capsys, tmp_path):
    path = tmp_path / "team.yaml"
    path.write_text(yaml.safe_dump(team_config(tiny_model_dir, "chain")))
    assert main(["validate", str(path), "-q", "--plan", "--device", "cuda:4MB", "--devices", "4"]) == 1
    out = capsys.readouterr().out
    assert "memory plan on cuda:4MB, 4 of them" in out and "does NOT fit" in out
    assert "policies.main.kind: lora" in out and "policies.main.workers: 4 with sharding: fsdp" in out
    assert "micro_batch_tokens" in out
    assert main(["validate", str(path), "-q", "--plan", "--device", "cuda:80GB"]) == 0
    assert "(fits)" in capsys.readouterr().out
    assert main(["validate", str(path), "-q", "--plan", "--device", "tpu:4"]) == 1
    assert "expected KIND or KIND:SIZE" in capsys.readouterr().err


def test_device_specs():
    assert parse_device("cuda:80GB") == ("cuda", 80 * GiB)
    assert parse_device("cpu:512MB") == ("cpu", 512 * 2**20)
    assert parse_device("cuda") == ("cuda", None)
    with pytest.raises(ValueError):
        parse_device("80GB")
    assert DevicePlan("cuda", None, []).fits is None  # an unknown capacity is neither


def test_the_plan_names_a_teams_worker_processes_beside_the_training_process(tiny_model_dir, capsys, tmp_path):
    cfg = team_config(tiny_model_dir, "chain")
    cfg["topology"] = {"kind": "openai", "entry": "endpoint_helpers:two_agents"}
    path = tmp_path / "team.yaml"
    path.write_text(yaml.safe_dump(cfg))
    assert main(["validate", str(path), "-q", "--plan", "--device", "cuda:80GB"]) == 0
    out = capsys.readouterr().out
    assert "worker process" not in out  # threads: nothing beside the process, but the framework's own memory is in it
    assert "host, not in any peak above: the team's code runs in this process" in out and "about 180 MB" in out
    cfg["topology"]["processes"] = 3
    path.write_text(yaml.safe_dump(cfg))
    assert main(["validate", str(path), "-q", "--plan", "--device", "cuda:80GB"]) == 0
    out = capsys.readouterr().out
    assert "host, not in any peak above: topology.processes: 3 worker processes" in out and "about 70 MB each" in out
