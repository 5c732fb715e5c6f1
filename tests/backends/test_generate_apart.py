"""``generate_apart``: how a failed batch fails only what failed (the engine's ``Batcher`` and
``mas serve``'s ``ServeBatcher`` both go through it)."""

from __future__ import annotations

import pytest

from mas.rollout.backends.base import BackendUnavailable, BatchError, GenRequest, GenResult, generate_apart


def req(tag: str) -> GenRequest:
    return GenRequest(policy="p", prompt_ids=[1], temperature=0.0, top_p=1.0, top_k=0, max_new_tokens=4, agent=tag)


def res(tag: str) -> GenResult:
    return GenResult(completion_ids=[2], logprobs=[-0.5], text=tag, finish_reason="stop")


class Backend:
    """Answers each request with its agent's name; ``bad`` agents make any batch holding them
    raise ``error`` (or, with ``per_row``, fail only their rows through a BatchError)."""

    def __init__(self, bad: set[str] = frozenset(), error: type[BaseException] = ValueError, per_row: bool = False,
                 short: bool = False):
        self.bad, self.error, self.per_row, self.short = set(bad), error, per_row, short
        self.calls: list[list[str]] = []

    def __call__(self, rows: list[GenRequest]) -> list[GenResult]:
        self.calls.append([r.agent for r in rows])
        if self.short:
            return [res(r.agent) for r in rows[:-1]]
        failing = [r for r in rows if r.agent in self.bad]
        if failing and self.per_row:
            raise BatchError([None if r.agent in self.bad else res(r.agent) for r in rows],
                             [self.error(r.agent) if r.agent in self.bad else None for r in rows])
        if failing:
            raise self.error(f"cannot serve {failing[0].agent}")
        return [res(r.agent) for r in rows]


def texts(outcome) -> list[str | None]:
    results, _ = outcome
    return [None if r is None else r.text for r in results]


def test_a_batch_that_succeeds_is_one_call_and_split_by_group():
    backend = Backend()
    out = generate_apart(backend, [[req("a")], [req("b"), req("c")], [req("d")]])
    assert backend.calls == [["a", "b", "c", "d"]]
    assert [texts(o) for o in out] == [["a"], ["b", "c"], ["d"]]
    assert [e for _, e in out] == [None, None, None]


def test_any_other_error_retries_each_group_alone_and_only_the_bad_group_fails():
    backend, seen = Backend(bad={"c"}), []
    out = generate_apart(backend, [[req("a")], [req("b"), req("c")], [req("d")]], on_retry=seen.append)
    assert backend.calls == [["a", "b", "c", "d"], ["a"], ["b", "c"], ["d"]]
    assert [str(e) for e in seen] == ["cannot serve c"]  # told once, before the retries
    assert texts(out[0]) == ["a"] and texts(out[2]) == ["d"]
    assert out[1][0] is None and isinstance(out[1][1], ValueError) and str(out[1][1]) == "cannot serve c"


def test_a_lone_group_is_not_sent_again():
    backend, seen = Backend(bad={"a"}), []
    out = generate_apart(backend, [[req("a"), req("b")]], on_retry=seen.append)
    assert backend.calls == [["a", "b"]] and seen == []
    assert out[0][0] is None and str(out[0][1]) == "cannot serve a"


def test_a_batch_error_fails_the_groups_of_the_failed_rows_with_their_first_error_and_keeps_the_rest():
    backend = Backend(bad={"c", "e"}, per_row=True)
    out = generate_apart(backend, [[req("a")], [req("b"), req("c"), req("e")], [req("d")]])
    assert backend.calls == [["a", "b", "c", "e", "d"]]  # no retry: the backend said which rows failed
    assert texts(out[0]) == ["a"] and texts(out[2]) == ["d"]
    assert texts(out[1]) == ["b", None, None] and str(out[1][1]) == "c"


def test_a_batch_error_on_a_retry_splits_that_group_too():
    class Mixed(Backend):  # the whole batch fails plainly; alone, the bad group's rows fail one by one
        def __call__(self, rows):
            if len(self.calls) == 0:
                self.calls.append([r.agent for r in rows])
                raise RuntimeError("the batch")
            self.per_row = True
            return super().__call__(rows)

    backend = Mixed(bad={"c"})
    out = generate_apart(backend, [[req("a")], [req("b"), req("c")]])
    assert texts(out[0]) == ["a"]
    assert texts(out[1]) == ["b", None] and str(out[1][1]) == "c"


def test_backend_unavailable_is_raised_at_once():
    with pytest.raises(BackendUnavailable):
        generate_apart(Backend(bad={"a"}, error=BackendUnavailable), [[req("a")], [req("b")]])


def test_a_wrong_number_of_results_fails_every_group():
    out = generate_apart(Backend(short=True), [[req("a")], [req("b")]])
    assert [r for r, _ in out] == [None, None]
    assert all(str(e) == "the backend returned 1 results for 2 requests" for _, e in out)


def test_a_retry_that_returns_a_wrong_number_of_results_fails_its_group_only():
    class ShortAlone(Backend):  # the batch fails; alone, group ["b", "c"] comes back one result short
        def __call__(self, rows):
            self.calls.append([r.agent for r in rows])
            if len(self.calls) == 1:
                raise RuntimeError("the batch")
            got = [res(r.agent) for r in rows]
            return got[:-1] if len(rows) == 2 else got

    out = generate_apart(ShortAlone(), [[req("a")], [req("b"), req("c")]])
    assert texts(out[0]) == ["a"]
    assert out[1][0] is None and str(out[1][1]) == "the backend returned 1 results for 2 requests"


def test_a_batch_error_whose_lists_do_not_match_or_a_row_with_neither_fails_instead_of_passing_none_on():
    """A router over several backends zips what each returns: a short answer left a row with no
    result and no error, and the engine's batcher then died counting the tokens of None."""

    def short_lists(rows):
        raise BatchError([res("a")], [None])  # two requests, one entry each

    out = generate_apart(short_lists, [[req("a")], [req("b")]])
    assert [r for r, _ in out] == [None, None]
    assert str(out[0][1]) == "the backend returned 1 results and 1 errors for 2 requests"

    def neither(rows):
        raise BatchError([res("a"), None], [None, None])

    out = generate_apart(neither, [[req("a")], [req("b")]])
    assert texts(out[0]) == ["a"] and out[0][1] is None
    assert str(out[1][1]) == "the backend returned neither a result nor an error for a request"
    out = generate_apart(lambda rows: [res("a"), None], [[req("a")], [req("b")]])  # a plain list with a hole
    assert out[0][1] is None and str(out[1][1]) == "the backend returned neither a result nor an error for a request"


def test_backend_unavailable_on_a_retry_is_raised_too():
    calls = []

    def gone_on_retry(rows):
        calls.append(len(rows))
        raise RuntimeError("the batch") if len(calls) == 1 else BackendUnavailable("the actor died")

    with pytest.raises(BackendUnavailable, match="the actor died"):
        generate_apart(gone_on_retry, [[req("a")], [req("b")], [req("c")]])
    assert calls == [3, 1]  # no more retries against a backend that is gone
