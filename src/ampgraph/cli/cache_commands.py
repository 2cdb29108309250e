"""The ``cache`` commands: where the cache of finished analyses is, how big, and clearing it."""

from __future__ import annotations

import click


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

    root, entries, size = cache.info()
    limit, source = cache.bound()
    click.echo(f"{root}: {entries} entr{'y' if entries == 1 else 'ies'}, {size / 1e6:.1f} MB "
               f"of at most {limit / 1e6:.1f} MB ({source})")  # fmt: skip
    note = cache.disk_note(limit)
    if note:
        click.echo(note)


@cache_group.command(name="clear")
def cache_clear() -> None:
    """Remove every cached analysis, and nothing else.

    Only ampgraph's own entries go: the files named by a hash in the cache's 'reports' folder,
    which carries ampgraph's CACHEDIR.TAG. Anything else in the cache folder is left alone.
    """
    from ampgraph.pipeline import cache

    removed, freed = cache.clear()
    click.echo(f"removed {removed} file{'s' if removed != 1 else ''} ({freed / 1e6:.1f} MB) "
               f"from {cache.cache_dir()}")  # fmt: skip
