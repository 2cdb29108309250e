"""The result: the :class:`~ampgraph.report.records.Report` later stages read, and its text forms."""
