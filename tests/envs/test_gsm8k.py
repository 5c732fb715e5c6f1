"""GSM8K env: shipped sample, local JSONL, bad data, lazy HF loading, stream, scoring."""

import json
import sys
import types

import pytest
from pydantic import ValidationError

from mas.envs.math.gsm8k import SAMPLE_DIR, GSM8KConfig, GSM8KEnv, load_jsonl
from mas.types import Episode


def row(question: str, final: str, work: str = "Some work.") -> dict:
    return {"question": question, "answer": f"{work}\n#### {final}"}


def write_jsonl(path, rows) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")


def local_env(tmp_path, **kw) -> GSM8KEnv:
    return GSM8KEnv(GSM8KConfig(name="gsm8k", source="local", path=str(tmp_path), **kw))


def episode(task, answer) -> Episode:
    return Episode(task=task, group_id=0, sample_id=0, seed=0, answer=answer)


@pytest.fixture
def local_dir(tmp_path):
    write_jsonl(tmp_path / "train.jsonl", [row(f"Train question {i}?", str(i)) for i in range(10)])
    write_jsonl(
        tmp_path / "test.jsonl",
        [row("How many?", "1,234", "1000+234=<<1000+234=1234>>1,234"), row("Less?", "-3")],
    )
    return tmp_path


# -- shipped sample -------------------------------------------------------------------------


def test_sample_loads_and_matches_files():
    env = GSM8KEnv(GSM8KConfig(name="gsm8k"))
    assert (env.num_train, env.num_eval) == (200, 100)
    assert (SAMPLE_DIR / "GSM8K_LICENSE").read_text().startswith("MIT License")
    first_test = json.loads((SAMPLE_DIR / "gsm8k_test_sample.jsonl").read_text().splitlines()[0])
    task = env.eval_tasks(1)[0]
    assert task.task_id == "gsm8k-test-0"
    assert task.prompt == first_test["question"]
    assert task.meta["solution"] == first_test["answer"]
    assert task.answer == first_test["answer"].rsplit("#### ", 1)[1].replace(",", "").strip()
    assert task.answer == "18"  # Janet's ducks
    for t in env.eval_tasks(100) + env.sample_tasks(200):
        assert t.answer.lstrip("-").isdigit(), t.answer  # GSM8K answers are integers


def test_sample_train_stream_is_seeded_epoch_permutation():
    env = GSM8KEnv(GSM8KConfig(name="gsm8k", seed=3))
    epoch0 = [t.task_id for t in env.sample_tasks(200)]
    epoch1 = [t.task_id for t in env.sample_tasks(200)]
    all_ids = {f"gsm8k-train-{i}" for i in range(200)}
    assert set(epoch0) == set(epoch1) == all_ids  # each problem once per epoch
    assert epoch0 != epoch1  # reshuffled each epoch
    assert epoch0 != sorted(epoch0, key=lambda s: int(s.rsplit("-", 1)[1]))  # shuffled at all
    again = GSM8KEnv(GSM8KConfig(name="gsm8k", seed=3))
    assert [t.task_id for t in again.sample_tasks(400)] == epoch0 + epoch1
    other = GSM8KEnv(GSM8KConfig(name="gsm8k", seed=4))
    assert [t.task_id for t in other.sample_tasks(200)] != epoch0


def test_resume_across_epoch_boundary():
    env = GSM8KEnv(GSM8KConfig(name="gsm8k", seed=1))
    env.sample_tasks(190)
    state = json.loads(json.dumps(env.state_dict()))
    expected = [t.task_id for t in env.sample_tasks(25)]  # crosses into epoch 1
    resumed = GSM8KEnv(GSM8KConfig(name="gsm8k", seed=1))
    resumed.load_state_dict(state)
    assert [t.task_id for t in resumed.sample_tasks(25)] == expected
    fresh = GSM8KEnv(GSM8KConfig(name="gsm8k", seed=1))
    assert [t.task_id for t in fresh.sample_tasks(25)] != expected


def test_resume_refuses_other_data_size():
    env = GSM8KEnv(GSM8KConfig(name="gsm8k"))
    env.sample_tasks(5)
    smaller = GSM8KEnv(GSM8KConfig(name="gsm8k", max_train=50))
    with pytest.raises(ValueError, match="num_train"):
        smaller.load_state_dict(env.state_dict())


def test_eval_tasks_prefix_and_too_many():
    env = GSM8KEnv(GSM8KConfig(name="gsm8k", max_eval=30, max_train=20))
    assert env.num_eval == 30 and env.num_train == 20
    assert env.eval_tasks(5) == env.eval_tasks(30)[:5]
    with pytest.raises(ValueError, match="has 30"):
        env.eval_tasks(31)
    train_q = {t.prompt for t in env.sample_tasks(20)}
    assert not train_q & {t.prompt for t in env.eval_tasks(30)}


# -- local files ----------------------------------------------------------------------------


def test_local_directory(local_dir):
    env = local_env(local_dir)
    assert env.num_train == 10
    t0, t1 = env.eval_tasks(2)
    assert (t0.answer, t1.answer) == ("1234", "-3")  # "#### 1,234" -> "1234"
    assert t0.meta["solution"].endswith("#### 1,234")
    assert env.score(episode(t0, "The answer is 1,234.")) == 1.0
    assert env.score(episode(t1, "-3")) == 1.0


def test_local_split_template(tmp_path):
    write_jsonl(tmp_path / "gsm_tr.jsonl", [row("A?", "1"), row("B?", "2")])
    write_jsonl(tmp_path / "gsm_dev.jsonl", [row("C?", "3")])
    env = GSM8KEnv(
        GSM8KConfig(
            name="gsm8k",
            source="local",
            path=str(tmp_path / "gsm_{split}.jsonl"),
            train_split="tr",
            eval_split="dev",
        )
    )
    assert env.num_train == 2 and [t.prompt for t in env.eval_tasks(1)] == ["C?"]
    assert env.eval_tasks(1)[0].task_id == "gsm8k-dev-0"


@pytest.mark.parametrize(
    "bad_line, needle",
    [
        ("{not json", "not valid JSON"),
        ('["a list"]', "expected a JSON object"),
        ('{"question": "Q?"}', "'answer'"),
        ('{"question": "", "answer": "#### 1"}', "'question'"),
        ('{"question": "Q?", "answer": "no marker 5"}', "####"),
        ('{"question": "Q?", "answer": "#### many"}', "not a number"),
    ],
)
def test_bad_line_names_file_and_line(local_dir, bad_line, needle):
    path = local_dir / "train.jsonl"
    lines = path.read_text().splitlines()
    lines.insert(2, "")  # blank lines are skipped but still counted
    lines.insert(3, bad_line)  # -> line 4
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(ValueError, match=needle) as err:
        local_env(local_dir)
    assert f"{path}:4:" in str(err.value)


def test_empty_file_raises(tmp_path):
    (tmp_path / "x.jsonl").write_text("\n\n")
    with pytest.raises(ValueError, match="no problems"):
        load_jsonl(tmp_path / "x.jsonl")


def test_missing_files_raise(tmp_path):
    with pytest.raises(FileNotFoundError, match="train.jsonl"):
        local_env(tmp_path)
    with pytest.raises(FileNotFoundError, match="neither a directory"):
        GSM8KEnv(GSM8KConfig(name="gsm8k", source="local", path=str(tmp_path / "nope.jsonl")))


def test_overlapping_splits_raise(tmp_path):
    write_jsonl(tmp_path / "train.jsonl", [row("Same?", "1"), row("Other?", "2")])
    write_jsonl(tmp_path / "test.jsonl", [row("Same?", "1")])
    with pytest.raises(ValueError, match="disjoint"):
        local_env(tmp_path)


# -- config ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "bad, needle",
    [
        ({"source": "local"}, "path is required"),
        ({"source": "local", "path": ""}, "path is required"),
        ({"path": "/tmp/x"}, "only used with source='local'"),
        ({"source": "s3"}, "source"),
        ({"eval_split": "validation"}, "valid choices"),
        ({"source": "hf", "eval_split": "train"}, "must differ"),
        ({"max_train": 0}, "max_train"),
        ({"split": "train"}, "split"),  # unknown key
    ],
)
def test_config_errors(bad, needle):
    with pytest.raises(ValidationError, match=needle):
        GSM8KConfig.model_validate({"name": "gsm8k", **bad})


def test_config_fields_documented_and_frozen():
    for name, field in GSM8KConfig.model_fields.items():
        assert field.description, f"{name} has no description"
    cfg = GSM8KConfig(name="gsm8k")
    assert (cfg.source, cfg.hf_dataset, cfg.hf_config) == ("sample", "openai/gsm8k", "main")
    with pytest.raises(ValidationError):
        cfg.seed = 1


# -- Hugging Face source (no network: a stand-in `datasets` module) -------------------------


def test_hf_source_uses_datasets_lazily(monkeypatch):
    calls = []

    def load_dataset(name, config, split):
        calls.append((name, config, split))
        n = {"train": 4, "test": 2}[split]
        return [row(f"{split} q{i}?", str(i * 1000)) for i in range(n)]

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=load_dataset))
    env = GSM8KEnv(GSM8KConfig(name="gsm8k", source="hf", hf_config="socratic"))
    assert calls == [("openai/gsm8k", "socratic", "train"), ("openai/gsm8k", "socratic", "test")]
    assert (env.num_train, env.num_eval) == (4, 2)
    assert env.eval_tasks(2)[1].answer == "1000"


def test_hf_bad_row_names_dataset_and_row(monkeypatch):
    def load_dataset(name, config, split):
        return [row("ok?", "1"), {"question": "bad?", "answer": "no marker"}]

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=load_dataset))
    with pytest.raises(ValueError, match=r"openai/gsm8k\[train\] row 1"):
        GSM8KEnv(GSM8KConfig(name="gsm8k", source="hf"))


def test_hf_without_datasets_installed(monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)  # makes `import datasets` fail
    with pytest.raises(ImportError, match="mas-rl\\[data\\]"):
        GSM8KEnv(GSM8KConfig(name="gsm8k", source="hf"))


# -- scoring --------------------------------------------------------------------------------


def test_score_hand_built_episodes():
    env = GSM8KEnv(GSM8KConfig(name="gsm8k"))
    task = env.eval_tasks(1)[0]  # answer 18
    assert env.score(episode(task, None)) == 0.0
    assert env.score(episode(task, "18")) == 1.0
    assert env.score(episode(task, "She makes $18.00 every day.")) == 1.0
    assert env.score(episode(task, "16 - 3 - 4 = 9 eggs, 9 * 2")) == 0.0
    assert env.score(episode(task, "")) == 0.0
