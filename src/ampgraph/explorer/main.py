"""ampgraph's adapter extension for Model Explorer (:mod:`ampgraph.explorer` says how to call
it): Model Explorer imports this module, ``ampgraph.explorer.main``, for the package named in
``--extensions=ampgraph.explorer``."""

from __future__ import annotations

from typing import Any

try:
    from model_explorer import Adapter, AdapterMetadata, graph_builder
except ImportError:  # pragma: no cover - the message is the behaviour
    raise ImportError(
        "ampgraph's Model Explorer adapter needs Model Explorer: pip install 'ampgraph[explorer]'"
    ) from None

from ampgraph.explorer import SUFFIX, parse_spec


class AmpgraphAdapter(Adapter):
    """ampgraph's analysis of a model spec, as Model Explorer graphs."""

    metadata = AdapterMetadata(
        id="ampgraph",
        name="ampgraph (autocast dtype flow)",
        description="Analyses a model spec (NAME[@SETTING+...].ampgraph) with ampgraph: every "
        "node's autocast policy and why, dtypes in and out, casts and their bytes.",
        fileExts=[SUFFIX.lstrip(".")],
    )

    def convert(self, model_path: str, settings: dict[str, Any]) -> dict[str, Any]:
        from ampgraph.pipeline.run import analyze_spec
        from ampgraph.render.explorer import explorer_graphs

        spec, names = parse_spec(model_path)
        reports = analyze_spec(spec, names, check=False)
        collection = explorer_graphs(reports)
        graphs = [
            graph_builder.Graph(id=g["id"], nodes=g["nodes"]) for g in collection["graphs"]
        ]
        return {
            "graphCollections": [
                graph_builder.GraphCollection(label=collection["label"], graphs=graphs)
            ]
        }
