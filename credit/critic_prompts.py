"""Default prompt templates of the LLM-as-critic credit method (``credit/critic.py``).

Templates are plain strings filled with ``str.format``: ``{name}`` is a placeholder and a
literal brace is written twice (``{{`` / ``}}``).  A template may be split into chat messages
by header lines that hold only ``[system]`` or ``[user]``; text before the first header (or a
template without headers) is one user message.  Headers are read from the template before it
is filled, so a placeholder's value (an agent's output, say) can never start a new message.

YAML overrides (``credit.prompt``) are checked when the config loads: a placeholder that is
not in the mode's list below is an error that lists the valid ones.

mappa placeholders (one critique per action; MAPPA, arXiv 2601.23228, ``ltjed/multiagent-coaching``):
    problem              the task as shown to the first agent
    agent_role           the name of the agent that acted
    agent_input          the full prompt of the action: its chat messages, one "ROLE: content" block each
    agent_output         the agent's reply
    tool_observation     the action's tool observations joined by newlines, truncated to
                         ``tool_observation_chars`` (MAPPA: 2,000) characters, or "N/A (no tools used)"
    ground_truth_answer  the task's answer for the final agent's actions, "N/A" for everyone else

llm_mca placeholders (one critique per episode; LLM-MCA, arXiv 2502.16863):
    problem              the task
    transcript           every message of the episode in order: "[t] agent (message k of that agent):"
                         then the text and any tool output
    outcome              the episode's outcome reward R
    agents               one line per agent that spoke: "- name: n message(s)"
    json_example         a JSON object with the expected keys and list lengths (zeros)
    num_turns            the number of messages T in the episode
    ground_truth_answer  the task's answer
"""

from __future__ import annotations

MAPPA_PLACEHOLDERS: tuple[str, ...] = (
    "problem",
    "agent_role",
    "agent_input",
    "agent_output",
    "tool_observation",
    "ground_truth_answer",
)
LLM_MCA_PLACEHOLDERS: tuple[str, ...] = (
    "problem",
    "transcript",
    "outcome",
    "agents",
    "json_example",
    "num_turns",
    "ground_truth_answer",
)

# MAPPA's MathChat coach prompt [C] (mathchat_with_coach.yaml), with the MathChat-specific
# team description and role checks made generic and the ANSWER_CORRECT request dropped (the
# released code logs it but never trains on it).
MAPPA_PROMPT = """\
You are evaluating a specific agent in a multi-agent system that collaboratively solves a problem.
The agents work in turns; each sees the problem and the messages it is given as input.
The success of the overall system is determined by the final answer.

When evaluating, consider whether the agent:
- (IMPORTANT) Performed well given its role and the information provided
- Stayed within its output length limit

**Problem that the overall system is solving:**
{problem}

**Current agent being evaluated:**
{agent_role}

**What the agent received as input:**
{agent_input}

**What the agent outputted:**
{agent_output}

**Environment feedback for the agent's tool call (if applicable):**
{tool_observation}

**Ground truth answer (if applicable):**
{ground_truth_answer}

Evaluate the agent's decision quality based on:
- Given the agent's role and the information it had as input, how helpful is its output towards the overall system's success?

Strictly assign a score from 0 (terrible) to 10 (perfect).

Structure your output in the following format exactly:

PROCESS_SCORE: [0 to 10]
"""

# Sent after a reply without a parsable score, as a follow-up turn of the same conversation
# (MAPPA's own retry prompt [C] quotes the bad reply in a fresh conversation instead).
MAPPA_RETRY_PROMPT = """\
Your previous reply did not contain a score in the required format.
Please provide your evaluation again using EXACTLY this format:

PROCESS_SCORE: [0 to 10]

Do not include any other text or explanation. Only output the score in the exact format shown above.
"""

# LLM-MCA's critic prompt (environment description, definitions, task query) as paraphrased by
# the third-party reimplementation [S], adapted to LLM agents [A]: a JSON object instead of
# numpy arrays, one credit per message, and the budget rule "credits sum to R".
LLM_MCA_PROMPT = """\
[system]
You are a credit assignment critic for a team of cooperating agents. You decompose the team's \
reward into the individual contribution of each agent's messages.
[user]
Definitions:
- Temporal credit assignment: deciding which messages, early or late, made the outcome happen.
- Structural credit assignment: deciding which agents made the outcome happen.
- Under-collaboration: an agent that contributes nothing useful, or ignores what the others said.
- Over-collaboration: agents that merely repeat each other instead of adding something new.
- Agreement problem: agents that agree on a wrong answer, or disagree on a right one.

Task the team was solving:
{problem}

Transcript ({num_turns} messages):
{transcript}

Outcome reward of the team: R = {outcome}

Agents and how many messages each sent:
{agents}

Assign a credit to every message of every agent depending on how much you think it contributed \
toward the outcome. The credits of all messages of all agents should add up to R.
Reply with one JSON object mapping each agent's name to the list of its credits, one number per \
message in the order the agent sent them, exactly in this shape:
{json_example}
"""
