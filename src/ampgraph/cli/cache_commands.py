"""The ``cache`` commands: where the cache of finished analyses is, how big, and clearing it."""

from __future__ import annotations

import click

from ampgraph.cli.console import write_output


@click.group(name="cache")
def cache_group() -> None:
    """Inspect or clear the cache of finished analyses.

    Analyses are cached by model config, sequence length, setting and options, and the
    environment (the versions of ampgraph, torch and transformers, where they are installed, the
    Python and the platform), so a second run reads them without importing torch. An entry is
    served only for the request it was stored for; anything else is analysed again. The cache
    lives in $AMPGRAPH_CACHE_DIR, else $XDG_CACHE_HOME/ampgraph, else ~/.cache/ampgraph, and
    takes at most $AMPGRAPH_CACHE_MAX_BYTES (default 512M; 0 caches nothing): the least recently
    used entries go first.
    """


@cache_group.command(name="info")
def cache_info() -> None:
    """Show where the cache is, how big it is, and how big it may grow."""
    from ampgraph.pipeline import cache

    limit, source = cache.bound()
    write_output("cache-info", "text", cache.info(), limit=limit, source=source,
                 note=cache.disk_note(limit))  # fmt: skip


@cache_group.command(name="clear")
def cache_clear() -> None:
    """Remove every cached analysis, and nothing else.

    Only ampgraph's own entries go: the files named by a hash in the cache's 'reports' folder,
    which carries ampgraph's CACHEDIR.TAG. Anything else in the cache folder is left alone.
    """
    from ampgraph.pipeline import cache

    write_output("cache-clear", "text", cache.clear(), folder=cache.cache_dir())
