from vlctl.report.writer import Report

__all__ = ["Report"]
