"""Facts: a generated multi-hop research task that a small model can learn (``env: {name: facts}``).

HotpotQA asks a 135M model to find an answer in Wikipedia prose it cannot read well.  This task
keeps the research protocol (search, read, search again, answer) and makes every step
something a small model can do: the paragraphs are short, regular sentences about fictional
people, organisations and cities, generated from a seed, and each question takes two hops:

    In which city is the organisation that Talin Vossar founded?

    hop 1  search("Talin Vossar")  ->  "Talin Vossar: Talin Vossar was born in Kessmere and worked as a ..."
           read("Talin Vossar")    ->  "... Talin Vossar founded the Orvex Guild in 1931."
    hop 2  search("Orvex Guild")   ->  "Orvex Guild: The Orvex Guild is based in Dunholm. It is a ..."
    answer Dunholm

The first paragraph names a city too (the person's birthplace, never the answer), and with the
shipped snippet length its search result shows the birthplace but not the organisation: a team
that answers after one search gives the birthplace, and one that reads and searches again finds
the answer.  The people and organisations are invented, so the answer cannot be known; it has
to be found.

The world (``generate_world``): ``num_train + num_eval`` chains, each a person (born in one
city, founder of one organisation) and an organisation (based in another city); every person and
organisation belongs to one chain only, so a held-out question names a person no training
question names, and its organisation is one no training chain reaches: what training teaches
is the protocol, not the answers.  The cities (``num_cities``) are shared by all chains, each
with a paragraph of its own.  The chains are split in generation order: the first ``num_train``
are the training questions, the rest the held-out ones.  Everything follows from
``corpus_seed``: the same seed gives the same world in every process (``random.Random`` seeded
with a string), and tests pin its contents.

Tools and scoring are HotpotQA's (``search.py``, ``metrics.py``): BM25 ``search`` and ``read``
over the world's paragraphs, reward EM or F1 of the team's answer against the city.  ``score``
also records, on ``episode.info["scores"]``: ``em``, ``f1``, ``support_any`` (the team's tool
calls showed at least one supporting paragraph) and ``support_all`` (they showed both, the
person's and the organisation's: both hops were made).  ``task.meta["supporting"]`` lists the
two titles in hop order, so the research turn verifier (``turns.verify_search_turn``) checks
this task's tool turns as it does HotpotQA's.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from mas.types import Episode, Task, Turn

from ..splits import Splits, SplitTasks
from .metrics import answer_scores
from ..registry import register_env
from ..verifiers import register_verifier
from .search import TOOL_NAMES, Corpus, Paragraph, build_tools
from .turns import observed_titles, verify_search_turn

__all__ = ["Chain", "FactsConfig", "FactsEnv", "QUESTION", "World", "generate_world", "support_scores"]

QUESTION = "In which city is the organisation that {person} founded?"
EXAMPLES = ("Ada Lovelace", "Ada Lovelace")  # the prompt's example calls: a name no generated world holds (no syllable gives it)

# Name parts.  Syllables give invented names; the organisation stems and the city names are
# built from other parts, so no word is shared between a person, an organisation and a city
# (BM25 finds an entity by its own words).
_ONSETS = ("b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z", "br", "dr", "gr", "kr", "st", "tr")
_VOWELS = ("a", "e", "i", "o", "u")
_CODAS = ("", "n", "l", "r", "s", "th")
_SURNAME_ENDS = ("ar", "en", "ick", "ow", "and", "ey", "in", "ell")
_ORG_ENDS = ("ex", "ax", "ium", "ora", "una", "ix")
_ORG_KINDS = (("Guild", "craft guild"), ("Institute", "research institute"), ("Press", "publishing house"),
              ("Foundry", "metal foundry"), ("Trust", "charitable trust"), ("Society", "learned society"),
              ("Works", "glass works"), ("Academy", "music academy"), ("Bank", "savings bank"), ("Company", "trading company"))
_CITY_STEMS = ("Ash", "Bel", "Cor", "Dun", "Elm", "Fen", "Gal", "Har", "Ket", "Lor", "Mar", "Nor", "Oak", "Pel", "Rav",
               "Sal", "Tam", "Ul", "Ver", "Wyn", "Yar", "Brim", "Cal", "Hol")
_CITY_ENDS = ("ford", "mere", "wick", "holm", "port", "field", "stead", "bury", "gate", "haven")
_CITY_KINDS = ("river town", "harbour town", "hill town", "market town", "mining town", "lake town")
_JOBS = ("weaver", "clockmaker", "surveyor", "glassblower", "cartographer", "brewer", "printer", "shipwright",
         "botanist", "luthier", "stonemason", "bookbinder")

# Organisation stems are one syllable and an ending (600 words): a world holds at most this many
# chains, so that fresh names never run out whatever the corpus seed (580 fit every seed tried).
MAX_CHAINS = 500


@dataclass(frozen=True)
class Chain:
    """One two-hop question's facts: ``person`` was born in ``birthplace`` and founded ``org``,
    which is based in ``city`` (the answer; never the birthplace)."""

    person: str
    birthplace: str
    job: str
    founded: int
    org: str
    kind: str
    city: str
    members: int

    @property
    def question(self) -> str:
        return QUESTION.format(person=self.person)

    def paragraphs(self) -> tuple[Paragraph, Paragraph]:
        return (Paragraph(self.person, f"{self.person} was born in {self.birthplace} and worked as a {self.job}. "
                                       f"{self.person} founded the {self.org} in {self.founded}."),
                Paragraph(self.org, f"The {self.org} is based in {self.city}. It is a {self.kind} with "
                                    f"{self.members} members."))


@dataclass(frozen=True)
class World:
    """The generated facts: every chain (training ones first) and every city's paragraph."""

    chains: tuple[Chain, ...]
    cities: tuple[Paragraph, ...]
    num_train: int

    @property
    def train(self) -> tuple[Chain, ...]:
        return self.chains[: self.num_train]

    @property
    def held_out(self) -> tuple[Chain, ...]:
        return self.chains[self.num_train:]

    def paragraphs(self) -> list[Paragraph]:
        return [p for c in self.chains for p in c.paragraphs()] + list(self.cities)


def _word(rng: random.Random, syllables: int, end: str = "") -> str:
    text = "".join(rng.choice(_ONSETS) + rng.choice(_VOWELS) for _ in range(syllables)) + (end or rng.choice(_CODAS))
    return text.capitalize()


def generate_world(seed: int, num_train: int, num_eval: int, num_cities: int) -> World:
    """The world of ``corpus_seed`` ``seed``: deterministic, whatever the process or platform."""
    if not 2 <= num_cities <= len(_CITY_STEMS):
        raise ValueError(f"num_cities must be between 2 and {len(_CITY_STEMS)}, got {num_cities}")
    rng = random.Random(f"mas/facts/{seed}")
    stems = rng.sample(_CITY_STEMS, num_cities)
    cities = [stem + rng.choice(_CITY_ENDS) for stem in stems]
    taken = {c.lower() for c in cities}  # every word names one thing only

    def fresh(make) -> str:
        for _ in range(1000):
            word = make()
            if word.lower() not in taken:
                taken.add(word.lower())
                return word
        raise RuntimeError("ran out of fresh names; the name space is too small for this many chains")

    first_names = [fresh(lambda: _word(rng, 2)) for _ in range(40)]  # shared: a search for a person may also find a namesake
    chains = []
    for _ in range(num_train + num_eval):
        person = f"{rng.choice(first_names)} {fresh(lambda: _word(rng, 2, rng.choice(_SURNAME_ENDS)))}"
        word, kind = rng.choice(_ORG_KINDS)
        org = f"{fresh(lambda: _word(rng, 1, rng.choice(_ORG_ENDS)))} {word}"
        city, birthplace = rng.sample(cities, 2)
        chains.append(Chain(person=person, birthplace=birthplace, job=rng.choice(_JOBS), founded=rng.randrange(1820, 1990),
                            org=org, kind=kind, city=city, members=rng.randrange(12, 900)))
    city_paragraphs = tuple(Paragraph(c, f"{c} is a {rng.choice(_CITY_KINDS)} with {rng.randrange(2, 90) * 1000} "
                                         f"inhabitants.") for c in cities)
    return World(tuple(chains), city_paragraphs, num_train)


def support_scores(episode: Episode) -> dict[str, float]:
    """Whether the episode's tool calls showed a supporting paragraph (``support_any``) and all of
    them (``support_all``); every agent's turns count."""
    titles = list(episode.task.meta.get("supporting") or [])
    seen: set[str] = set()
    for turn in episode.turns:
        if turn.tool_calls:
            seen |= observed_titles(turn, titles)
    return {"support_any": float(bool(seen)), "support_all": float(bool(titles) and seen >= set(titles))}


class FactsConfig(BaseModel):
    """Generated two-hop questions about fictional people, organisations and cities, with the
    research tools (env section of the run config)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: Literal["facts"] = Field(description="Selects this env.")
    corpus_seed: int = Field(0, ge=0, description="Seed of the generated world (people, organisations, cities, questions).")
    num_train: int = Field(400, ge=1, description="Training questions (one chain each).")
    num_eval: int = Field(100, ge=1, description="Held-out questions, about people and organisations no training question names.")
    num_cities: int = Field(16, ge=2, le=len(_CITY_STEMS), description="Cities shared by all chains: the answers.")
    seed: int = Field(0, ge=0, description="Seed of the per-epoch training shuffle (the world does not depend on it).")
    reward: Literal["f1", "em"] = Field("em", description="Outcome reward: exact match or F1 of the answer against the city.")
    search_k: int = Field(2, ge=1, description="Results of a search call that gives no k.")
    max_k: int = Field(3, ge=1, description="Largest k a search call may ask for.")
    snippet_chars: int = Field(
        60, ge=20, description="Characters of each paragraph shown in search results (60: a person's result shows "
        "the birthplace but not the organisation, which takes a read).")
    read_chars: int = Field(200, ge=50, description="Characters of a paragraph returned by read (every paragraph is shorter).")

    @model_validator(mode="after")
    def _fits_the_name_space(self) -> FactsConfig:
        if self.num_train + self.num_eval > MAX_CHAINS:
            raise ValueError(f"num_train + num_eval is {self.num_train + self.num_eval}, more than the {MAX_CHAINS} chains a "
                             f"world can name (organisation names are one syllable and an ending)")
        return self


class FactsEnv(SplitTasks):
    """Env over :class:`FactsConfig`: generates the world and indexes its paragraphs at build time."""

    def __init__(self, cfg: FactsConfig) -> None:
        self.cfg = cfg
        self.world = generate_world(cfg.corpus_seed, cfg.num_train, cfg.num_eval, cfg.num_cities)
        self.corpus = Corpus(self.world.paragraphs())
        self.tools = build_tools(self.corpus, cfg.search_k, cfg.max_k, cfg.snippet_chars, cfg.read_chars,
                                 what="paragraphs about people, organisations and cities", examples=EXAMPLES)
        self._splits = Splits("facts", self._tasks(self.world.train, "train"), self._tasks(self.world.held_out, "eval"),
                              cfg.seed, f"the held-out split (env.num_eval={cfg.num_eval})")

    @staticmethod
    def _tasks(chains: tuple[Chain, ...], split: str) -> list[Task]:
        return [Task(task_id=f"facts-{split}-{i}", prompt=c.question, answer=c.city,
                     meta={"answers": [c.city], "supporting": [c.person, c.org]})
                for i, c in enumerate(chains)]

    # -- Env protocol (tasks: SplitTasks) ----------------------------------------------------

    def score(self, episode: Episode) -> float:
        """``reward`` (EM or F1) of the team's answer; em, f1 and the support scores are recorded on ``info["scores"]``."""
        scores = answer_scores(episode.answer, episode.task.meta["answers"])
        episode.info["scores"] = {**scores, **support_scores(episode)}
        return scores[self.cfg.reward]

    def verify_turn(self, episode: Episode, turn: Turn) -> float | None:
        """A search or read turn: did it reach a supporting paragraph (``turns.verify_search_turn``)."""
        return verify_search_turn(episode, turn)

    def describe(self) -> dict[str, Any]:
        """Data source and size, for the reporting checklist."""
        c = self.cfg
        return {"name": "facts", "source": f"generated two-hop facts (corpus_seed {c.corpus_seed})",
                "train_size": f"{self.num_train} questions", "eval_size": f"{self.num_eval} questions (unseen people)",
                "corpus": f"{len(self.corpus)} paragraphs (BM25), reward {c.reward}"}


register_env("facts", FactsConfig, FactsEnv, tools=TOOL_NAMES)
register_verifier("facts", verify_search_turn)
