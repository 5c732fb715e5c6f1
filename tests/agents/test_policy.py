"""Policies: LoRA adapters sharing one base, isolation of updates, reference models, checkpoints."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from mas.agents.policy import ModelLoadError, PolicyHandle, build_policies, load_model_and_tokenizer

IDS = torch.tensor([[3, 23, 15, 24, 1, 4, 40, 41, 42]])


def logits(model, ids=IDS):
    with torch.no_grad():
        return model(input_ids=ids).logits


def snapshot(model):
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def adamw_step(handle, lr=1e-2):
    """One optimizer step on ``handle``'s parameters with a loss computed under ``activate()``."""
    opt = torch.optim.AdamW(handle.trainable_parameters(), lr=lr)
    with handle.activate() as model:
        out = model(input_ids=IDS, labels=IDS)
        out.loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    handle.mark_updated()


# ----------------------------------------------------------------------------- kinds


def test_full_policy_trains_everything(policy_config):
    h = build_policies({"p": policy_config("full")})["p"]
    assert h.kind == "full" and h.trainable and h.adapter is None
    assert h.device == torch.device("cpu")
    params = h.trainable_parameters()
    assert {id(p) for p in params} == {id(p) for p in h.model.parameters()}
    assert all(p.requires_grad for p in params)
    assert not h.model.training  # eval for sampling
    assert h.tokenizer.padding_side == "left"


def test_frozen_policy_has_no_trainable_parameters(policy_config):
    h = build_policies({"critic": policy_config("frozen")})["critic"]
    assert h.kind == "frozen" and not h.trainable
    assert h.trainable_parameters() == []
    assert not any(p.requires_grad for p in h.model.parameters())
    assert not h.model.training
    with h.reference() as ref:
        assert ref is h.model


def test_build_policies_keeps_config_order_and_backend(policy_config):
    hs = build_policies({"z": policy_config("lora"), "a": policy_config("full"), "m": policy_config("lora")})
    assert list(hs) == ["z", "a", "m"]
    assert all(h.backend == "hf" and h.name == n for n, h in hs.items())


# ----------------------------------------------------------------------------- LoRA


def test_lora_policies_share_one_base_model(lora_pair, policy_config, tiny_model_dir_b):
    a, b = lora_pair["alpha"], lora_pair["beta"]
    assert a.model is b.model  # one PeftModel holding both adapters
    assert (a.adapter, b.adapter) == ("alpha", "beta")
    assert set(a.model.peft_config) == {"alpha", "beta"}
    embeddings = [n for n, _ in a.model.named_parameters() if "embed_tokens" in n]
    assert len(embeddings) == 1  # one copy of the base weights
    assert not a.model.training
    # another base model is another PeftModel
    hs = build_policies({"alpha": policy_config("lora"), "c": policy_config("lora", model=str(tiny_model_dir_b))})
    assert hs["alpha"].model is not hs["c"].model


def base_tensors(model) -> set[int]:
    """Storage of every non-adapter tensor of ``model`` (its base's weights and buffers)."""
    named = [*model.named_parameters(), *model.named_buffers()]
    return {t.untyped_storage().data_ptr() for n, t in named if "lora_" not in n}


@pytest.mark.parametrize("order", ["frozen_first", "lora_first"])
def test_a_frozen_policy_on_a_lora_base_shares_its_tensors_and_sees_the_base_alone(policy_config, tiny_model_dir, order):
    cfgs = {"judge": policy_config("frozen"), "alpha": policy_config("lora")}
    if order == "lora_first":
        cfgs = dict(reversed(cfgs.items()))
    hs = build_policies(cfgs, seed=0)
    judge, alpha = hs["judge"], hs["alpha"]
    assert base_tensors(judge.model) == base_tensors(alpha.model)  # one set of base tensors in memory
    assert not any("lora_" in n for n, _ in judge.model.named_parameters())  # no adapter layers in its tree
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    before = logits(judge.model)
    torch.testing.assert_close(before, logits(base), atol=1e-5, rtol=0)
    for _ in range(3):
        adamw_step(alpha, lr=5e-2)
    with alpha.activate():
        assert not torch.allclose(logits(alpha.model), before, atol=1e-4)  # the adapter trained
    with judge.activate() as model:  # the frozen policy still computes the base, without the adapter
        assert torch.equal(logits(model), before)
    assert not any(p.requires_grad for p in judge.model.parameters())


def test_frozen_policies_on_one_model_share_one_module(policy_config, tiny_model_dir_b):
    hs = build_policies({"a": policy_config("frozen"), "b": policy_config("frozen"),
                         "c": policy_config("frozen", model=str(tiny_model_dir_b))})
    assert hs["a"].model is hs["b"].model and hs["c"].model is not hs["a"].model


def test_lora_trainable_parameters_are_disjoint_and_lora_only(lora_pair):
    a, b = lora_pair["alpha"], lora_pair["beta"]
    pa, pb = a.trainable_parameters(), b.trainable_parameters()
    names = {id(p): n for n, p in a.model.named_parameters()}
    # 2 layers x 4 target modules x (lora_A, lora_B)
    assert len(pa) == len(pb) == 2 * 4 * 2
    assert not ({id(p) for p in pa} & {id(p) for p in pb})
    assert all("lora_" in names[id(p)] and ".alpha." in names[id(p)] for p in pa)
    assert all("lora_" in names[id(p)] and ".beta." in names[id(p)] for p in pb)
    # selection is by name: it does not depend on requires_grad
    with b.activate():
        assert len(a.trainable_parameters()) == 16 and not any(p.requires_grad for p in a.trainable_parameters())


def test_activate_leaves_only_that_adapter_requiring_grad(lora_pair):
    a, b = lora_pair["alpha"], lora_pair["beta"]
    for h, other in ((a, b), (b, a)):
        with h.activate() as model:
            assert model is h.model
            mine = {id(p) for p in h.trainable_parameters()}
            assert all(p.requires_grad == (id(p) in mine) for p in model.parameters())
            assert not any(p.requires_grad for p in other.trainable_parameters())


def test_lora_step_on_a_leaves_b_and_base_bit_identical(lora_pair):
    a, b = lora_pair["alpha"], lora_pair["beta"]
    model = a.model
    before = snapshot(model)
    base_logits = logits(model)
    adamw_step(a)
    after = snapshot(model)
    a_names = {n for n, p in model.named_parameters() if any(p is q for q in a.trainable_parameters())}
    changed = {n for n in before if not torch.equal(before[n], after[n])}
    assert changed and changed <= a_names  # only A's adapter moved
    assert all(p.grad is None for p in b.trainable_parameters())
    with a.activate():
        assert not torch.allclose(logits(model), base_logits)
    with b.activate():  # B untouched: its lora_B is still zero, so it computes the base function
        assert torch.equal(logits(model), base_logits)
    assert a.version == 1 and b.version == 0


def test_lora_reference_gives_base_model_logits(lora_pair, tiny_model_dir):
    a = lora_pair["alpha"]
    adamw_step(a)
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    with a.activate():
        assert not torch.allclose(logits(a.model), logits(base), atol=1e-5)
    with a.reference() as ref:
        torch.testing.assert_close(logits(ref), logits(base), atol=1e-5, rtol=0)
    with a.activate():  # adapter is back on after the reference block
        assert not torch.allclose(logits(a.model), logits(base), atol=1e-5)


def test_lora_init_is_seeded(policy_config):
    def lora_a(seed):
        h = build_policies({"alpha": policy_config("lora")}, seed=seed)["alpha"]
        return [p.detach().clone() for p in h.trainable_parameters()]

    first, again, other = lora_a(0), lora_a(0), lora_a(1)
    assert all(torch.equal(x, y) for x, y in zip(first, again))
    assert not all(torch.equal(x, y) for x, y in zip(first, other))


def test_bad_lora_policy_name_is_rejected(policy_config):
    for bad in ("lora_x", "my.policy", "a"):
        with pytest.raises(ValueError, match="adapter name"):
            build_policies({bad: policy_config("lora")})


# ----------------------------------------------------------------------------- full reference


def test_full_reference_is_a_frozen_copy_of_the_initial_weights(policy_config):
    h = build_policies({"p": policy_config("full")})["p"]
    initial = logits(h.model)
    with h.reference() as ref:
        assert ref is not h.model
        assert not ref.training and not any(p.requires_grad for p in ref.parameters())
        torch.testing.assert_close(logits(ref), initial, atol=0, rtol=0)
    adamw_step(h)
    assert not torch.allclose(logits(h.model), initial)
    with h.reference() as ref:
        torch.testing.assert_close(logits(ref), initial, atol=0, rtol=0)


def test_full_reference_after_update_or_resume_reloads_initial_weights(policy_config, tmp_path):
    h = build_policies({"p": policy_config("full")})["p"]
    initial = logits(h.model)
    adamw_step(h)
    h.save_pretrained(tmp_path / "ckpt")
    h2 = build_policies({"p": policy_config("full")})["p"]
    h2.load_weights(tmp_path / "ckpt")  # a resumed run: first reference() comes after the load
    with h2.reference() as ref:
        assert ref is not h2.model
        assert not ref.training and not any(p.requires_grad for p in ref.parameters())
        torch.testing.assert_close(logits(ref), initial, atol=0, rtol=0)
    assert not torch.allclose(logits(h2.model), initial)


def test_full_reference_without_source_refuses_to_copy_updated_weights(tiny_model, tiny_tokenizer):
    h = PolicyHandle("p", "full", tiny_model, tiny_tokenizer, "cpu")
    adamw_step(h)
    with pytest.raises(RuntimeError, match="snapshot_reference"):
        with h.reference():
            pass


# ----------------------------------------------------------------------------- checkpoints


def test_full_save_load_roundtrip(policy_config, tmp_path):
    h = build_policies({"p": policy_config("full")})["p"]
    adamw_step(h)
    saved = snapshot(h.model)
    h.save_pretrained(tmp_path / "ckpt")
    assert (tmp_path / "ckpt" / "tokenizer.json").is_file()
    params_before = {n: p for n, p in h.model.named_parameters()}
    with torch.no_grad():
        for p in h.model.parameters():
            p.add_(torch.randn_like(p))
    version = h.version
    h.load_weights(tmp_path / "ckpt")
    after = snapshot(h.model)
    assert all(torch.equal(saved[n], after[n]) for n in saved)
    assert all(p is params_before[n] for n, p in h.model.named_parameters())  # in place
    assert h.version == version + 1


def test_lora_save_load_roundtrip(lora_pair, tmp_path):
    a, b = lora_pair["alpha"], lora_pair["beta"]
    adamw_step(a)
    saved_a = [p.detach().clone() for p in a.trainable_parameters()]
    a.save_pretrained(tmp_path / "alpha")
    assert (tmp_path / "alpha" / "adapter_config.json").is_file()  # flat layout
    assert (tmp_path / "alpha" / "adapter_model.safetensors").is_file()
    assert sorted(p.name for p in (tmp_path / "alpha").iterdir() if p.is_dir()) == []  # only this adapter, no sub-folders
    with torch.no_grad():
        for p in a.trainable_parameters() + b.trainable_parameters():
            p.add_(torch.randn_like(p))
    saved_b = [p.detach().clone() for p in b.trainable_parameters()]
    a.load_weights(tmp_path / "alpha")
    assert all(torch.equal(x, p) for x, p in zip(saved_a, a.trainable_parameters()))
    assert all(torch.equal(x, p) for x, p in zip(saved_b, b.trainable_parameters()))  # B not touched


def test_lora_checkpoint_loads_into_another_adapter_name(lora_pair, tmp_path):
    a, b = lora_pair["alpha"], lora_pair["beta"]
    adamw_step(a)
    a.save_pretrained(tmp_path / "alpha")
    b.load_weights(tmp_path / "alpha")
    assert all(torch.equal(x, y) for x, y in zip(a.trainable_parameters(), b.trainable_parameters()))


# ----------------------------------------------------------------------------- loading


def test_missing_local_path_names_policy_and_model(policy_config, tmp_path):
    missing = str(tmp_path / "no-such-model")
    with pytest.raises(ModelLoadError) as err:
        build_policies({"solver": policy_config("full", model=missing)})
    assert "'solver'" in str(err.value) and missing in str(err.value)
    with pytest.raises(ModelLoadError, match="'critic'"):
        build_policies({"critic": policy_config("lora", model=missing)})


def test_unknown_hub_id_offline_names_policy_and_model(policy_config, monkeypatch):
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)  # never touch the network
    with pytest.raises(ModelLoadError, match="'judge'.*'no-such-org/no-such-model'"):
        build_policies({"judge": policy_config("frozen", model="no-such-org/no-such-model")})


def test_missing_pad_token_falls_back_to_eos(tiny_model_dir, tmp_path):
    model, tok = load_model_and_tokenizer(str(tiny_model_dir), "float32", "cpu", False)
    tok.pad_token = None
    tok.save_pretrained(tmp_path)
    model.save_pretrained(tmp_path)
    _, tok2 = load_model_and_tokenizer(str(tmp_path), "float32", "cpu", False)
    assert tok2.pad_token_id == tok2.eos_token_id
    assert tok2.padding_side == "left"


def test_dtype_is_applied(tiny_model_dir):
    model, _ = load_model_and_tokenizer(str(tiny_model_dir), "bfloat16", "cpu", False)
    assert next(model.parameters()).dtype == torch.bfloat16


def test_handle_forces_left_padding(tiny_model, tiny_tokenizer):
    tiny_tokenizer.padding_side = "right"
    try:
        h = PolicyHandle("p", "full", tiny_model, tiny_tokenizer, "cpu")
        assert h.tokenizer.padding_side == "left"
    finally:
        tiny_tokenizer.padding_side = "left"
