"""Three CrewAI agents share one zettelq namespace: a researcher and an analyst each finish a task,
the crew's memory stores what they found (fire-and-forget stores), and a writer's task prompt then
carries their memories, recalled from zettelq.

Needs ``pip install 'zettelq[crewai]'``, a Redis and a worker (``zettelq dev``), and an
OpenAI-compatible chat endpoint for the agents, e.g. Ollama:

    python examples/crewai_crew.py --llm-url http://127.0.0.1:11434/v1 --model ollama/llama3.2

(run by tests/adapters/test_crewai.py against a scripted loopback chat server).
"""

from __future__ import annotations

import argparse
import os

from crewai import LLM, Agent, Crew, Process, Task
from crewai.memory.unified_memory import Memory

from producer import MemoryClient
from producer.adapters.crewai import ZettelqStorage, zettelq_embedder

NAMESPACE = "acme-crew"  #: the one namespace the crew's agents share


def build_crew(client: MemoryClient, llm: LLM) -> Crew:
    """A sequential crew whose memory is zettelq, with zettelq's embedder."""
    memory = Memory(
        llm=llm,
        storage=ZettelqStorage(client, NAMESPACE),
        embedder=zettelq_embedder(client, NAMESPACE),
    )
    roles = {
        "researcher": "Find how the customer's Snowflake account authenticates.",
        "analyst": "Find when the customer's Snowflake keys are rotated.",
        "writer": "Write a one-line security summary of the customer's Snowflake setup.",
    }
    agents = {
        role: Agent(role=role, goal=goal, backstory=f"The crew's {role}.", llm=llm)
        for role, goal in roles.items()
    }
    # context=[]: no task sees another's output; what the writer knows comes from memory
    tasks = [
        Task(description=goal, expected_output="One sentence.", agent=agents[role], context=[])
        for role, goal in roles.items()
    ]
    return Crew(
        agents=list(agents.values()), tasks=tasks, process=Process.sequential, memory=memory
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--llm-url", required=True, help="OpenAI-compatible base URL (…/v1)")
    parser.add_argument("--model", default="openai/gpt-4o-mini", help="provider/model name")
    args = parser.parse_args()
    os.environ.setdefault("CREWAI_TRACING_ENABLED", "false")
    llm = LLM(model=args.model, base_url=args.llm_url, api_key=os.environ.get("LLM_API_KEY", "-"))
    with MemoryClient() as client:
        crew = build_crew(client, llm)
        result = crew.kickoff()
        crew.memory.drain_writes()  # the crew stores its memories in the background
        print(result.raw)
        for hit in client.search("Snowflake keys", namespace=NAMESPACE, k=5):
            print(f"{hit.score:.3f} {hit.content}")


if __name__ == "__main__":
    main()
