"""The ``zettelq`` command (``main``): the client commands an agent's developer uses
(``commands``), the operator's (``operations``, ``health``, ``top``, ``transfer``, ``graph``),
the servers it starts (``serve``, ``mcp``), the demo, the env-file generator (``envfile``), how
results print (``console``) and how a command fails (``failure``).

Nothing is re-exported here: each subcommand imports what it needs when it runs, so ``zettelq
store`` works on a base install and ``zettelq --help`` loads no worker code."""
