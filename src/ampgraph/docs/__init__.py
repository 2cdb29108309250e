"""Documentation: the Sphinx directive that draws diagrams in a build, and the op reference."""
