from ampgraph.cli import run

run()
