"""A two-agent team written with the plain ``openai`` client: a solver answers, a checker reviews.

Nothing in it knows about mas: run against OpenAI it would call two models; trained with mas
(``examples/openai_team.yaml``, ``kind: openai``) its ``base_url`` is the endpoint mas serves for
the episode and the model names are the YAML agents, each trained on its own weights.
"""

from __future__ import annotations

import httpx
from openai import OpenAI

SOLVER = "You solve arithmetic problems. Reply with ANSWER: <number>."
CHECKER = "You check a solution. Reply with ANSWER: <number>, then ACCEPT or REJECT."


# One connection pool for every episode: each episode has its own base_url, hence its own client,
# and a client left to build its own pool also builds a TLS context (tens of ms of CPU) per episode.
HTTP = httpx.Client()


def run_team(task: str, base_url: str, api_key: str) -> str:
    client = OpenAI(base_url=base_url, api_key=api_key, max_retries=0, http_client=HTTP)
    draft = client.chat.completions.create(
        model="solver",
        messages=[{"role": "system", "content": SOLVER}, {"role": "user", "content": task}],
    ).choices[0].message.content or ""
    review = client.chat.completions.create(
        model="checker",
        messages=[{"role": "system", "content": CHECKER}, {"role": "user", "content": f"{task}\nsolver: {draft}"}],
    ).choices[0].message.content or ""
    return review if "ACCEPT" in review or "REJECT" in review else draft
