"""Sphinx extension: ``.. ampgraph:: MODEL`` draws ampgraph's dtype-flow diagram in the build.

Add it to ``conf.py``::

    extensions = ["ampgraph.sphinx"]

then, in reStructuredText::

    .. ampgraph:: opt-125m
       :setting: amp-fp32
       :caption: OPT-125M with autocast on and fp32 parameters

or in MyST Markdown::

    ```{ampgraph} opt-125m
    :setting: amp-fp32
    ```

The argument is any model spec ``ampgraph`` takes (a bundled name, a Hugging Face
``config.json`` -- relative to the document or the working directory -- or
``package.module:factory``, or ``file.py:factory`` relative to the document, whose figure is
titled as written); ``:report: FILE`` draws a saved ``ampgraph table --format json``
report instead, without torch. Options:

* ``:setting:`` -- setting names, separated by commas or spaces (default: the seed's four,
  drawn as the 2x2 overview); one setting draws its full diagram, several the overview.
* ``:recipe:`` -- instead of ``:setting:``, a framework's precision flag as ``--recipe`` takes
  it (``lightning:bf16-mixed``, ``fsdp2:param_dtype=bf16,reduce_dtype=fp32``; several separated
  by spaces, since a recipe holds commas), read by :func:`ampgraph.recipes.parse_recipe` for the
  ``:device:``; a DeepSpeed config is found relative to the document. ``:describe:`` adds what
  each recipe runs below the figure, as ``--recipe`` prints it on stderr.
* ``:view:`` -- ``modules`` (default) or ``ops``; ``:unfold:`` draws every repeated layer.
* ``:pass:`` -- ``forward`` (default) or ``backward``: the gradients of a training step, with the
  memory saved for backward (one setting: a backward has no overview).
* ``:theme:`` -- ``auto`` (default): a light and a dark figure, of which the page shows the one
  that matches its theme (the ``only-light``/``only-dark`` classes that furo and
  pydata-sphinx-theme switch; ``prefers-color-scheme`` elsewhere); ``light`` or ``dark``: that
  one only.
* ``:amp-dtype:`` -- ``bf16`` (default) or ``fp16``; ``:device:`` -- ``cuda`` (default),
  ``cpu``, ``xpu`` or ``mps``; ``:seq-len:`` and ``:no-check:`` as on the command line.
* ``:timeout:`` -- seconds the analysis may take (default ``ampgraph_timeout``, 600; 0: no
  bound; else 1 to 604800), as ``--timeout``: the analysis runs in a process group of its own
  that is killed then, and a model's ``sys.exit``, ``os._exit`` or fork is a warning, never the
  end of the build.
* ``:interactive:`` -- ``link``: beside "Open full size", a link to the same reports as one
  interactive page (``render --format html``: pan, zoom, unfold, search, a node's annotation
  on a click), written next to the SVG; ``embed``: that page shown in the document itself,
  where scripts run (a script swaps it in), the SVG staying where they do not.
* ``:caption:``, ``:alt:``, ``:align:``, ``:name:``, ``:class:`` -- as for ``figure``.

How it fits Sphinx: the directive emits :class:`sphinx.ext.graphviz.graphviz` nodes (a subclass,
so that dark figures can be left out of PDF) holding ampgraph's DOT source, and the HTML writer
lays them out with ``sphinx.ext.graphviz``'s own :func:`~sphinx.ext.graphviz.render_dot`
(its ``graphviz_dot`` and ``graphviz_dot_args`` settings apply). Files are named by a hash of
their source, so a rebuild writes the same bytes and a git diff of built pages stays quiet.
Analyses come from ampgraph's cache (:mod:`ampgraph.pipeline.cache`): the first build of a 70B model
takes seconds, later builds read JSON. The extension keeps no state between documents, so it is
safe for parallel reading and writing (``sphinx-build -j auto``). A model that fails to analyse
is a Sphinx warning with the one-line reason (``ampgraph`` warning type) and no figure; the
rest of the build goes on.

>>> from ampgraph.docs.directive import parse_settings
>>> parse_settings("amp-fp32, fp32")
['amp-fp32', 'fp32']
>>> parse_recipes("fsdp2:param_dtype=bf16,reduce_dtype=fp32  accelerate:bf16")
['fsdp2:param_dtype=bf16,reduce_dtype=fp32', 'accelerate:bf16']
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
from collections.abc import Sequence
from html import escape
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Final

from docutils import nodes
from docutils.parsers.rst import directives
from sphinx.ext.graphviz import (
    graphviz,
    latex_visit_graphviz,
    man_visit_graphviz,
    render_dot,
    texinfo_visit_graphviz,
    text_visit_graphviz,
)
from sphinx.util import logging
from sphinx.util.docutils import SphinxDirective

from ampgraph.errors import first_line
from ampgraph.model.usercode import DEFAULT_TIMEOUT, parse_timeout
from ampgraph.report.records import Report
from ampgraph.settings import DEVICE_TYPES
from ampgraph.version import __version__

if TYPE_CHECKING:
    from sphinx.application import Sphinx
    from sphinx.util.typing import ExtensionMetadata

    from ampgraph.recipes import Recipe
    from ampgraph.render import Diagram
    from ampgraph.settings import Setting

logger = logging.getLogger(__name__)

THEMES: Final = ("auto", "light", "dark")
#: The CSS this extension adds: figures fit the column, and the dark/light switch for themes
#: that have no ``only-dark``/``only-light`` rules of their own.
CSS_FILE: Final = "ampgraph.css"


class ampgraph_diagram(graphviz):
    """One laid-out ampgraph figure: a :class:`sphinx.ext.graphviz.graphviz` node with ``theme``,
    ``title`` and ``description`` (for the SVG's ``<title>``/``<desc>``) besides ``code``."""


def parse_settings(text: str | None) -> list[str]:
    """Setting names from the ``:setting:`` option: commas or spaces between them."""
    return [s for s in re.split(r"[\s,]+", text or "") if s]


def parse_recipes(text: str | None) -> list[str]:
    """Recipes from the ``:recipe:`` option: spaces between them (a recipe holds commas)."""
    return (text or "").split()


#: A recipe whose value names a file: DeepSpeed's ds_config.json (``deepspeed:``, ``ds:``).
CONFIG_RECIPE: Final = re.compile(r"^\s*(deepspeed|ds)\s*:\s*(?P<path>.+?)\s*$", re.IGNORECASE)
#: A factory in a Python file (``block.py:tiny_block``): the file, then the factory's name.
FILE_FACTORY: Final = re.compile(r"^(?P<path>.+\.py):(?P<name>[A-Za-z_]\w*)$")


def _choice(values: Sequence[str]) -> Any:
    return lambda argument: directives.choice(argument, tuple(values))


def analysis_reports(
    spec: str,
    settings: Sequence[str | Setting],
    *,
    device: str,
    amp_dtype: str,
    seq_len: int,
    check: bool,
    workers: int | None,
    pass_: str = "forward",
    timeout: float | None = None,
) -> list[Report]:
    """The reports of ``spec`` in ``settings``, through ampgraph's cache (computed on a miss);
    ``pass_`` ``backward`` analyses a training step (its default loss, backward outside
    autocast) as ``ampgraph render --pass backward`` does. The analysis runs in a process group
    of its own, killed after ``timeout`` seconds (None: no bound), as the command line's. A
    setting is a name, read for ``device`` and ``amp_dtype``, or a
    :class:`~ampgraph.settings.Setting` (a recipe's), used
    as it is."""
    from ampgraph.pipeline.request import AnalysisRequest
    from ampgraph.pipeline.run import analyze_request
    from ampgraph.settings import Setting, seed_matrix

    resolved = [
        s if isinstance(s, Setting) else Setting.parse(s, device_type=device, amp_dtype=amp_dtype)
        for s in settings
    ] or seed_matrix(device, amp_dtype)
    request = AnalysisRequest(spec, tuple(resolved), pass_=pass_, seq_len=seq_len, check=check,
                              timeout=timeout)  # fmt: skip
    return analyze_request(
        request, workers=workers,
        process=True,  # a model's code never ends or stalls the build
    )  # fmt: skip


class AmpgraphDirective(SphinxDirective):
    """``.. ampgraph:: MODEL``: see the module documentation for the options."""

    has_content = False
    required_arguments = 0
    optional_arguments = 1
    final_argument_whitespace = False
    option_spec: ClassVar[dict[str, Any]] = {
        "setting": directives.unchanged,
        "settings": directives.unchanged,
        "recipe": directives.unchanged,
        "describe": directives.flag,
        "report": directives.path,
        "view": _choice(("modules", "ops")),
        "pass": _choice(("forward", "backward")),
        "unfold": directives.flag,
        "theme": _choice(THEMES),
        "amp-dtype": _choice(("bf16", "fp16", "bfloat16", "float16")),
        "device": _choice(DEVICE_TYPES),
        "seq-len": directives.positive_int,
        "no-check": directives.flag,
        "timeout": lambda text: parse_timeout(text or ""),
        "interactive": _choice(("link", "embed")),
        "caption": directives.unchanged,
        "alt": directives.unchanged,
        "align": _choice(("left", "center", "right")),
        "name": directives.unchanged,
        "class": directives.class_option,
    }

    def run(self) -> list[nodes.Node]:
        try:
            recipes = self._recipes()
            reports = self._reports(recipes)
            figures = self._figures(reports)
        except Exception as exc:  # noqa: BLE001 - any failure is one warning, never a crash
            what = self.arguments[0] if self.arguments else self.options.get("report", "")
            logger.warning(
                "ampgraph could not draw %s: %s",
                what or "a diagram",
                first_line(exc),
                location=self.get_location(),
                type="ampgraph",
                subtype="analysis",
            )
            return []
        out = self._wrap(figures)
        if "describe" in self.options:
            # One block, figure and text together: a grid of two such figures (two recipes
            # side by side) keeps each description under its own figure.
            out = [
                nodes.container(
                    "", *out, *self._descriptions(recipes), classes=["ampgraph-described"]
                )
            ]
        return out

    def _recipes(self) -> list[Recipe]:
        """The ``:recipe:`` option read as the CLI's ``--recipe`` reads it, for the ``:device:``:
        the same :func:`~ampgraph.recipes.parse_recipe`, so a figure shows what the command
        analyses. A DeepSpeed config next to the document is a dependency of it."""
        texts = parse_recipes(self.options.get("recipe"))
        if not texts:
            if "describe" in self.options:
                raise ValueError(":describe: describes a :recipe:; give one")
            return []
        if self.options.get("setting") or self.options.get("settings"):
            raise ValueError("give :setting: or :recipe:, not both (a recipe is a setting)")
        if "amp-dtype" in self.options:
            raise ValueError("a recipe fixes its 16-bit dtype: leave out :amp-dtype:")
        from ampgraph.recipes import parse_recipe

        recipes = []
        for written in texts:
            text = written
            match = CONFIG_RECIPE.match(written)
            if match and match["path"].lower() not in ("bf16", "fp16", "fp32"):
                rel, path = self.env.relfn2path(match["path"])
                if Path(path).exists():  # not is_file: a FIFO there is the reader's to refuse
                    self.env.note_dependency(rel)
                    text = f"{match[1]}:{path}"
            recipe = parse_recipe(text, device_type=self.options.get("device", "cuda"))
            if match and text != written:
                # Described as the document spells it, not by the build machine's folders.
                recipe = dataclasses.replace(recipe, spelling=f"deepspeed:{match['path']}")
            recipes.append(recipe)
        return recipes

    def _descriptions(self, recipes: list[Recipe]) -> list[nodes.Node]:
        """What each recipe runs, as ``--recipe`` prints it: one text block under the figure."""
        text = "\n".join(recipe.describe() for recipe in recipes)
        block = nodes.literal_block(text, text, classes=["ampgraph-recipe"])
        block["language"] = "text"
        self.set_source_info(block)
        return [block]

    def _reports(self, recipes: Sequence[Recipe] = ()) -> list[Report]:
        settings: list[Any] = parse_settings(
            self.options.get("setting") or self.options.get("settings")
        )
        if recipes:
            settings = [recipe.setting for recipe in recipes]
        if "report" in self.options:
            if self.arguments:
                raise ValueError("give a model or :report:, not both")
            rel, path = self.env.relfn2path(self.options["report"])
            self.env.note_dependency(rel)
            from ampgraph.report.reading import read_text
            from ampgraph.report.validate import load_json

            # The one reader: a FIFO or /dev/zero here must not hang or fill the build's memory.
            loaded = load_json(read_text(path, "report"))
            reports = [
                Report.from_dict(d) for d in (loaded if isinstance(loaded, list) else [loaded])
            ]
            if settings:
                # A recipe picks the report of its setting; a name picks by name.
                wanted = [getattr(s, "name", s) for s in settings]
                reports = [r for r in reports if r.setting.get("name") in wanted]
                if not reports:
                    raise ValueError(f"{self.options['report']} has none of {', '.join(wanted)}")
            return reports
        written = spec = self.arguments[0] if self.arguments else "opt-125m"
        rel, path = self.env.relfn2path(spec)
        factory = FILE_FACTORY.match(spec)
        if Path(path).exists():
            # A config shipped with the documentation: relative to the document, and a
            # dependency, so editing it redraws the figure.
            self.env.note_dependency(rel)
            spec = str(path)
        elif factory:
            rel, path = self.env.relfn2path(factory["path"])
            if Path(path).is_file():
                # A model defined next to the document, as a config can be; named below as the
                # document writes it, so the figure's title holds no folder of the build machine.
                self.env.note_dependency(rel)
                spec = f"{path}:{factory['name']}"
        config = self.config
        reports = analysis_reports(
            spec,
            settings,
            device=self.options.get("device", "cuda"),
            amp_dtype=self.options.get("amp-dtype", "bf16"),
            seq_len=self.options.get("seq-len", 8),
            check=config.ampgraph_check and "no-check" not in self.options,
            workers=config.ampgraph_jobs,
            pass_=self.options.get("pass", "forward"),
            timeout=(
                self.options["timeout"] if "timeout" in self.options
                else parse_timeout(config.ampgraph_timeout)
            ),
        )  # fmt: skip
        if factory and spec != written:
            reports = [dataclasses.replace(r, model=written) for r in reports]
        return reports

    def _figures(self, reports: list[Report]) -> list[ampgraph_diagram]:
        from ampgraph.render import diagram, overview_diagram

        view = self.options.get("view", "modules")
        pass_ = self.options.get("pass", "forward")
        fold = "unfold" not in self.options
        theme = self.options.get("theme", self.config.ampgraph_theme)
        themes = ("light", "dark") if theme == "auto" else (theme,)
        figures = []
        for name in themes:
            if len(reports) == 1 or pass_ == "backward":
                # A backward has no overview: the first report's diagram (give one setting).
                drawn: Diagram = diagram(reports[0], view=view, fold=fold, theme=name, pass_=pass_)
            else:
                drawn = overview_diagram(reports, view=view, fold=fold, theme=name)
            node = ampgraph_diagram()
            node["code"] = drawn.source
            node["options"] = {"docname": self.env.docname}
            node["theme"] = name
            node["title"] = drawn.title
            node["description"] = drawn.description
            node["alt"] = self.options.get("alt", drawn.title)
            mode = self.options.get("interactive")
            if mode:
                from ampgraph.render.html import html_page

                # A link opens one page for both themes (the light one: half the files); an
                # embedded page matches the figure it stands in for.
                node["page"] = html_page(reports, theme=name if mode == "embed" else "light",
                                         fold=fold)  # fmt: skip
                node["embed"] = mode == "embed"
            node["classes"] = ["ampgraph", f"ampgraph-{name}", *self.options.get("class", [])]
            if theme == "auto":
                node["classes"].append(f"only-{name}")
            self.set_source_info(node)
            figures.append(node)
        return figures

    def _wrap(self, figures: list[ampgraph_diagram]) -> list[nodes.Node]:
        align = self.options.get("align")
        if "caption" not in self.options:
            if align:
                for node in figures:
                    node["align"] = align
            if len(figures) == 1:
                self.add_name(figures[0])
                return list(figures)
            container = nodes.container("", *figures, classes=["ampgraph-figures"])
            self.add_name(container)
            return [container]
        figure = nodes.figure("", *figures)
        if align:
            figure["align"] = align
        inodes, messages = self.parse_inline(self.options["caption"])
        caption = nodes.caption(self.options["caption"], "", *inodes)
        caption.extend(messages)
        self.set_source_info(caption)
        figure += caption
        self.add_name(figure)
        return [figure]


# -- writers --------------------------------------------------------------------------------------


def html_visit_ampgraph(self: Any, node: ampgraph_diagram) -> None:
    """Lay the figure out with ``sphinx.ext.graphviz`` and embed the SVG as an ``<object>``, so
    its tooltips work and its element ids stay its own (a page may hold the same figure twice:
    light and dark)."""
    from ampgraph.render.files import atomic_write
    from ampgraph.render.svg import accessible_bytes

    try:
        relfn, outfn = render_dot(self, node["code"], node["options"], "svg", prefix="ampgraph")
    except Exception as exc:  # noqa: BLE001 - a layout failure is a warning, like graphviz's
        logger.warning("ampgraph: dot failed: %s", first_line(exc), location=node,
                       type="ampgraph", subtype="render")  # fmt: skip
        raise nodes.SkipNode from None
    if relfn is None or outfn is None:  # dot is missing: graphviz has warned once already
        raise nodes.SkipNode
    svg = Path(outfn).read_bytes()
    marked = accessible_bytes(svg, node["title"], node["description"])
    if marked != svg:
        atomic_write(Path(outfn), marked)
    classes = " ".join(node["classes"])
    alt = escape(node["alt"])
    if "align" in node:
        self.body.append(f'<div class="align-{node["align"]}">')
    self.body.append(
        f'<div class="{escape(classes)}">'
        f'<object data="{escape(Path(relfn).as_posix())}" type="image/svg+xml" role="img" '
        f'aria-label="{alt}" class="ampgraph-svg">'
        f'<p class="warning">{alt}</p></object>'
        # A column is narrower than most diagrams: the SVG itself, opened in a tab, is at its
        # natural size and keeps its tooltips.
        f'<a class="ampgraph-full" href="{escape(Path(relfn).as_posix())}" target="_blank" '
        f'rel="noopener">Open full size</a>{_interactive(node, relfn, outfn)}</div>\n'
    )
    if "align" in node:
        self.body.append("</div>\n")
    raise nodes.SkipNode


#: Shows the embedded page and hides the SVG before it, where scripts run; where they do not,
#: the page stays hidden and the SVG is the figure.
_SWAP: Final = (
    "<script>(function(d){d.querySelector('.ampgraph-page').hidden=false;"
    "d.querySelector('object.ampgraph-svg').style.display='none';})"
    "(document.currentScript.parentNode)"
    "</script>"
)


def _interactive(node: ampgraph_diagram, relfn: str, outfn: str) -> str:
    """The interactive page's link (and frame, for ``:interactive: embed``), written beside the
    SVG and named by a hash of its text, as the SVG is by its source; "" without the option."""
    from ampgraph.render.files import atomic_write

    page = node.get("page")
    if not page:
        return ""
    data = page.encode("utf-8")
    name = f"ampgraph-page-{hashlib.sha256(data).hexdigest()[:16]}.html"
    target = Path(outfn).with_name(name)
    if not target.exists() or target.read_bytes() != data:
        atomic_write(target, data)
    href = escape((Path(relfn).parent / name).as_posix())
    link = (
        f' · <a class="ampgraph-interactive" href="{href}" target="_blank" rel="noopener">'
        "Open interactive</a>"
    )
    if not node.get("embed"):
        return link
    return (
        f'{link}<div class="ampgraph-page" hidden><iframe src="{href}" loading="lazy" '
        f'title="{escape(node["alt"])} (interactive)" '
        'style="width:100%;height:36em;border:1px solid #d0d7de;border-radius:4px">'
        f"</iframe></div>{_SWAP}"
    )


def _light_only(visit: Any) -> Any:
    """A writer for print-like formats: the light figure only (they have no dark mode)."""

    def visit_light(self: Any, node: ampgraph_diagram) -> None:
        if node.get("theme") == "dark":
            raise nodes.SkipNode
        visit(self, node)

    return visit_light


# -- set-up ---------------------------------------------------------------------------------------


def analysis_environment() -> str:
    """A digest of what the figures depend on besides the documents: ampgraph's code (renderer
    included) and the versions of torch and transformers. Sphinx re-reads every document when
    it changes, so an upgrade redraws the figures and nothing else does.
    """
    package = Path(__file__).resolve().parent.parent
    digest = hashlib.sha256(__version__.encode())
    for path in sorted(package.rglob("*")):
        if path.suffix in (".py", ".json"):
            digest.update(str(path.relative_to(package)).encode() + b"\0" + path.read_bytes())
    for dist in ("torch", "transformers"):
        try:
            digest.update(f"{dist}={metadata.version(dist)}".encode())
        except metadata.PackageNotFoundError:
            digest.update(f"{dist}=none".encode())
    return digest.hexdigest()[:16]


CSS: Final = """\
/* ampgraph.docs.directive: figures fit the column; tooltips need the <object> to stay interactive. */
div.ampgraph { margin: 1em 0; overflow-x: auto; }
div.ampgraph object.ampgraph-svg { max-width: 100%; height: auto; display: block; }
figure div.ampgraph { margin: 0.5em auto; }
div.ampgraph a.ampgraph-full { display: inline-block; font-size: 0.85em; margin-top: 0.25em; }
div.ampgraph a.ampgraph-full::after { content: " \\2197"; }
/* Themes without a dark-mode switch of their own (no data-theme attribute anywhere): follow the
   reader's system setting. furo and pydata-sphinx-theme switch only-light/only-dark themselves. */
@media (prefers-color-scheme: dark) {
  html:not([data-theme]) body:not([data-theme]) div.ampgraph-light.only-light { display: none; }
}
@media not all and (prefers-color-scheme: dark) {
  html:not([data-theme]) body:not([data-theme]) div.ampgraph-dark.only-dark { display: none; }
}
"""


def _write_css(app: Sphinx, exception: Exception | None) -> None:
    if exception is not None or app.builder.format != "html":
        return
    from ampgraph.render.files import atomic_write

    static = Path(app.outdir) / "_static"
    static.mkdir(parents=True, exist_ok=True)
    target = static / CSS_FILE
    if not target.exists() or target.read_text(encoding="utf-8") != CSS:
        atomic_write(target, CSS.encode("utf-8"))


def setup(app: Sphinx) -> ExtensionMetadata:
    """Register the directive, its node and its settings (``ampgraph_check``: run the
    dispatcher check, default True; ``ampgraph_jobs``: worker processes, default one per core;
    ``ampgraph_theme``: the default ``:theme:``, ``auto``; ``ampgraph_timeout``: the default
    ``:timeout:``, 600 seconds)."""
    app.setup_extension("sphinx.ext.graphviz")
    app.add_node(
        ampgraph_diagram,
        html=(html_visit_ampgraph, None),
        latex=(_light_only(latex_visit_graphviz), None),
        texinfo=(_light_only(texinfo_visit_graphviz), None),
        text=(_light_only(text_visit_graphviz), None),
        man=(_light_only(man_visit_graphviz), None),
    )
    app.add_directive("ampgraph", AmpgraphDirective)
    app.add_config_value("ampgraph_check", True, "env", types=frozenset({bool}))
    app.add_config_value("ampgraph_jobs", None, "env", types=frozenset({int, type(None)}))
    app.add_config_value("ampgraph_theme", "auto", "env", types=frozenset({str}))
    app.add_config_value(
        "ampgraph_timeout", DEFAULT_TIMEOUT, "env", types=frozenset({int, float})
    )
    # Not for users to set: its value changing (a new ampgraph, torch or transformers) is what
    # makes Sphinx re-read the documents and redraw.
    app.add_config_value(
        "ampgraph_environment", analysis_environment(), "env", types=frozenset({str})
    )
    app.add_css_file(CSS_FILE)
    app.connect("build-finished", _write_css)
    return {"version": __version__, "parallel_read_safe": True, "parallel_write_safe": True}
