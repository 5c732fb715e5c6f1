"""A manager agent that delegates to a calculator agent with a tool, written with smolagents and its
``OpenAIServerModel`` as smolagents' multi-agent guide writes it.

The shape is the guide's: a managed agent with a ``name`` and a ``description`` and its own tools,
handed to a manager through ``managed_agents``; the manager calls it like a tool (``calculator``
with a ``task`` argument) and finishes with the ``final_answer`` tool.  The calculator's tool is a
function decorated with ``@tool`` (its docstring describes the argument, as smolagents requires).

What differs from the docs (examples/README.md): each agent has its own ``OpenAIServerModel`` whose
``model_id`` is the YAML agent's name (the guide shares one model), with ``api_base`` and ``api_key``
from mas; the prompts ask for ``ANSWER: <number>``, the env's answer format.  One more: the guide's
manager is a ``CodeAgent``, which runs the Python the model writes in this process; here it is a
``ToolCallingAgent`` (smolagents' other agent class, which writes its calls as JSON tool calls),
because mas treats model output as untrusted and never runs it outside its sandbox.  Each agent's
``max_steps`` is small so an untrained model's episode ends soon.

Trained with mas: ``configs/openai_smolagents_manager.yaml`` (``kind: openai``).
"""

from __future__ import annotations

from smolagents import LogLevel, OpenAIServerModel, ToolCallingAgent, tool

from examples.calculator import calculate as evaluate


@tool
def calculate(expression: str) -> str:
    """Evaluates an arithmetic expression of integers with +, - and *.

    Args:
        expression: the expression, e.g. '3+4*2'.
    """
    return evaluate(expression)


def run_team(task: str, base_url: str, api_key: str) -> str:
    calculator_model = OpenAIServerModel(model_id="calculator", api_base=base_url, api_key=api_key,
                                         client_kwargs={"max_retries": 0})
    manager_model = OpenAIServerModel(model_id="manager", api_base=base_url, api_key=api_key,
                                      client_kwargs={"max_retries": 0})

    calculator_agent = ToolCallingAgent(
        tools=[calculate],
        model=calculator_model,
        max_steps=2,
        name="calculator",
        description="Does arithmetic for you. Give it the expression to evaluate as your task.",
        verbosity_level=LogLevel.OFF,
    )
    manager_agent = ToolCallingAgent(
        tools=[],
        model=manager_model,
        managed_agents=[calculator_agent],
        max_steps=2,
        instructions="Give your final answer as ANSWER: <number>.",
        verbosity_level=LogLevel.OFF,
    )
    return str(manager_agent.run(task))
