"""The HotpotQA env: data sources, corpus and BM25 tools, reward, stream, config errors."""

from __future__ import annotations

import json
import sys
import types

import pytest
from pydantic import ValidationError

from mas.tools import ToolError
from mas.envs import build_env
from mas.envs.research import Corpus, HotpotQAConfig, HotpotQAEnv, Paragraph
from mas.envs.research.hotpotqa import SAMPLE_DIR, load_questions, normalise_row
from mas.types import Episode, Task


def ircot_row(qid: str, question: str, answer: str, paragraphs: list[tuple[str, str, bool]]) -> dict:
    return {
        "question_id": qid,
        "question_text": question,
        "answers_objects": [{"number": "", "date": {"day": "", "month": "", "year": ""}, "spans": [answer]}],
        "contexts": [{"id": str(i), "title": t, "paragraph_text": x, "is_supporting": s} for i, (t, x, s) in enumerate(paragraphs)],
    }


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


ROWS = [
    ircot_row("q1", "Which river flows through Paris?", "Seine",
              [("Paris", "Paris is the capital of France on the river Seine.", True), ("Lyon", "Lyon lies on the Rhone.", False)]),
    ircot_row("q2", "Who wrote Hamlet?", "William Shakespeare",
              [("Hamlet", "Hamlet is a tragedy by William Shakespeare.", True), ("Paris", "Paris is the capital of France on the river Seine.", False)]),
    ircot_row("q3", "What is the capital of Japan?", "Tokyo",
              [("Tokyo", "Tokyo is the capital of Japan.", True), ("Kyoto", "Kyoto was the old capital.", False)]),
]


# --- shipped sample -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def sample_env():
    return HotpotQAEnv(HotpotQAConfig(name="hotpotqa"))


def test_shipped_sample_has_200_questions_with_two_supporting_paragraphs(sample_env):
    assert sample_env.num_train == 150 and sample_env.num_eval == 50
    tasks = sample_env.eval_tasks(50) + sample_env.sample_tasks(150)
    assert len({t.task_id for t in tasks}) == 200
    assert all(len(t.meta["supporting"]) == 2 and t.meta["answers"] for t in tasks)
    assert len(sample_env.corpus) == 1999  # 2,000 candidate paragraphs, one title repeated
    assert sample_env.corpus.conflicts == 0
    for name in ("README.md", "LICENSE"):
        assert (SAMPLE_DIR / name).is_file()


def test_env_tools_are_the_ones_configs_are_checked_against(sample_env):
    from mas.envs import ENV_TOOLS

    assert tuple(sample_env.tools) == ENV_TOOLS["hotpotqa"] == ("search", "read")
    assert all(sample_env.tools[name].name == name for name in sample_env.tools)


def test_sample_supporting_paragraphs_are_reachable_by_search_and_read(sample_env):
    task = sample_env.eval_tasks(1)[0]
    search, read = sample_env.tools["search"].fn, sample_env.tools["read"].fn
    out = search(query=task.prompt, k=10)
    assert out.startswith(f'search("{task.prompt}", k=10)')
    for title in task.meta["supporting"]:
        assert read(title=title).startswith(f"{title}: ")


# --- loading ------------------------------------------------------------------------------------


def test_local_directory_and_split_pattern(tmp_path):
    write_jsonl(tmp_path / "train.jsonl", ROWS[:2])
    write_jsonl(tmp_path / "dev.jsonl", ROWS[2:])
    for path in (str(tmp_path), str(tmp_path / "{split}.jsonl")):
        env = build_env(HotpotQAConfig(name="hotpotqa", source="local", path=path, eval_split="dev"))
        assert env.num_train == 2 and env.num_eval == 1
        assert env.eval_tasks(1)[0].task_id == "hotpotqa-dev-q3" and env.eval_tasks(1)[0].answer == "Tokyo"
        assert len(env.corpus) == 5  # Paris appears in two questions: one document


def test_single_file_with_holdout(tmp_path):
    path = write_jsonl(tmp_path / "dev_subsampled.jsonl", ROWS)
    env = HotpotQAEnv(HotpotQAConfig(name="hotpotqa", source="local", path=str(path), holdout=1))
    assert [t.prompt for t in env.eval_tasks(1)] == ["What is the capital of Japan?"]
    assert env.num_train == 2
    with pytest.raises(ValueError, match="set holdout"):
        HotpotQAEnv(HotpotQAConfig(name="hotpotqa", source="local", path=str(path)))
    with pytest.raises(ValueError, match="leaves no training"):
        HotpotQAEnv(HotpotQAConfig(name="hotpotqa", source="local", path=str(path), holdout=3))


def test_hotpotqa_native_formats_are_read():
    columns = {  # the datasets version: dicts of lists
        "id": "5a8b", "question": "Q?", "answer": "yes", "type": "comparison", "level": "hard",
        "supporting_facts": {"title": ["A", "A", "B"], "sent_id": [0, 1, 0]},
        "context": {"title": ["A", "B", "C"], "sentences": [["A is one.", " A is two."], ["B is."], ["C is."]]},
    }
    pairs = {  # the original JSON: lists of pairs
        "_id": "5a8c", "question": "Q2?", "answer": "no",
        "supporting_facts": [["B", 0]], "context": [["A", ["A is one."]], ["B", ["B is."]]],
    }
    row = normalise_row(columns, "x")
    assert row["answers"] == ["yes"] and row["id"] == "5a8b"
    assert row["paragraphs"][0] == {"title": "A", "text": "A is one. A is two.", "supporting": True}
    assert [p["supporting"] for p in row["paragraphs"]] == [True, True, False]
    assert [p["supporting"] for p in normalise_row(pairs, "y")["paragraphs"]] == [False, True]


def test_hf_source_goes_through_datasets(monkeypatch):
    """No network here: a stand-in `datasets` module returns rows in the hub dataset's format."""
    calls = []

    def fake_load(name, config, split):
        calls.append((name, config, split))
        rows = {"train": ROWS[:2], "validation": ROWS[2:]}[split]
        return [{"id": r["question_id"], "question": r["question_text"], "answer": r["answers_objects"][0]["spans"][0],
                 "supporting_facts": {"title": [c["title"] for c in r["contexts"] if c["is_supporting"]], "sent_id": [0]},
                 "context": {"title": [c["title"] for c in r["contexts"]], "sentences": [[c["paragraph_text"]] for c in r["contexts"]]}}
                for r in rows]

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=fake_load))
    env = HotpotQAEnv(HotpotQAConfig(name="hotpotqa", source="hf"))
    assert calls == [("hotpotqa/hotpot_qa", "distractor", "train"), ("hotpotqa/hotpot_qa", "distractor", "validation")]
    assert env.num_train == 2 and env.eval_tasks(1)[0].meta["supporting"] == ["Tokyo"]


@pytest.mark.parametrize(
    "line,match",
    [
        ("{not json", "not valid JSON"),
        ('{"foo": 1}', "neither 'question_text'"),
        ('{"question_text": "q", "answers_objects": [], "contexts": [], "question_id": "1"}', "no gold answer"),
        ('{"question_text": "q", "question_id": "1", "contexts": []}', "missing field 'answers_objects'"),
    ],
)
def test_malformed_lines_name_file_and_line(tmp_path, line, match):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(ROWS[0]) + "\n" + line + "\n")
    with pytest.raises(ValueError, match=match) as e:
        load_questions(path)
    assert f"{path}:2" in str(e.value)


def test_overlapping_splits_raise(tmp_path):
    write_jsonl(tmp_path / "train.jsonl", ROWS)
    write_jsonl(tmp_path / "validation.jsonl", ROWS[2:])
    with pytest.raises(ValueError, match="disjoint"):
        HotpotQAEnv(HotpotQAConfig(name="hotpotqa", source="local", path=str(tmp_path)))


@pytest.mark.parametrize(
    "fields,match",
    [
        ({"source": "local"}, "path is required"),
        ({"path": "x"}, "only used with source='local'"),
        ({"train_split": "dev"}, "not in the shipped sample"),
        ({"search_k": 5, "max_k": 3}, "larger than max_k"),
        ({"reward": "bleu"}, "reward"),
        ({"holdout": 5}, "holdout"),
    ],
)
def test_config_errors(fields, match):
    with pytest.raises(ValidationError, match=match):
        HotpotQAConfig(name="hotpotqa", **fields)


# --- corpus and tools ---------------------------------------------------------------------------


@pytest.fixture()
def tools(tmp_path):
    write_jsonl(tmp_path / "train.jsonl", ROWS[:2])
    write_jsonl(tmp_path / "validation.jsonl", ROWS[2:])
    return HotpotQAEnv(HotpotQAConfig(name="hotpotqa", source="local", path=str(tmp_path), snippet_chars=20)).tools


def test_search_ranks_by_bm25_and_cuts_snippets(tools):
    out = tools["search"].fn(query="capital of Japan", k=2)
    lines = out.splitlines()
    assert lines[0] == 'search("capital of Japan", k=2): 2 result(s)'
    assert lines[1] == "1. Tokyo: Tokyo is the capital ..."  # title + the first 20 characters
    assert lines[2].startswith("2. ")
    assert "no paragraph matches" in tools["search"].fn(query="the of and", k=3)  # stop words only
    assert "no paragraph matches" in tools["search"].fn(query="zebra", k=3)
    with pytest.raises(ToolError, match="between 1 and 10"):
        tools["search"].fn(query="Tokyo", k=11)


def test_read_matches_titles_leniently_and_suggests_close_ones(tools):
    assert tools["read"].fn(title="Hamlet") == "Hamlet: Hamlet is a tragedy by William Shakespeare."
    assert tools["read"].fn(title="  hamlet ").startswith("Hamlet:")
    with pytest.raises(ToolError, match="closest titles: Hamlet"):
        tools["read"].fn(title="Hamlett")


def test_corpus_keeps_the_first_text_of_a_title_and_counts_conflicts():
    c = Corpus([Paragraph("A", "alpha one"), Paragraph("A", "alpha two"), Paragraph("B", "beta"), Paragraph("A", "alpha one")])
    assert len(c) == 2 and c.conflicts == 1 and c.get("A").text == "alpha one"
    assert c.search_titles("beta", 5) == ["B"]
    with pytest.raises(ValueError, match="empty"):
        Corpus([])


# --- reward and stream --------------------------------------------------------------------------


def test_score_is_f1_or_em_and_records_both(sample_env):
    task = Task("t", "q", "Chief of Protocol", meta={"answers": ["Chief of Protocol"], "supporting": []})
    ep = Episode(task=task, group_id=0, sample_id=0, seed=0, answer="chief protocol")
    # pred [chief, protocol] vs gold [chief, of, protocol]: P 1, R 2/3 -> F1 0.8
    assert sample_env.score(ep) == pytest.approx(0.8)
    assert ep.info["scores"] == {"em": 0.0, "f1": pytest.approx(0.8)}
    em_env = HotpotQAEnv(HotpotQAConfig(name="hotpotqa", reward="em", max_train=2, max_eval=2))
    assert em_env.score(ep) == 0.0
    ep.answer = "The chief of protocol"
    assert em_env.score(ep) == 1.0
    ep.answer = None
    assert em_env.score(ep) == 0.0 and ep.info["scores"] == {"em": 0.0, "f1": 0.0}


def test_stream_is_seeded_and_resumable():
    a = HotpotQAEnv(HotpotQAConfig(name="hotpotqa", seed=3))
    first = [t.task_id for t in a.sample_tasks(160)]  # crosses an epoch boundary (150)
    assert len(set(first[:150])) == 150
    b = HotpotQAEnv(HotpotQAConfig(name="hotpotqa", seed=3))
    b.sample_tasks(7)
    state = b.state_dict()
    c = HotpotQAEnv(HotpotQAConfig(name="hotpotqa", seed=3))
    c.load_state_dict(state)
    assert [t.task_id for t in c.sample_tasks(10)] == first[7:17]
    with pytest.raises(ValueError):
        HotpotQAEnv(HotpotQAConfig(name="hotpotqa", seed=4)).load_state_dict(state)
    with pytest.raises(ValueError, match="has 50"):
        a.eval_tasks(51)
