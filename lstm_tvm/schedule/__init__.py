"""Default (rule-based) schedules, chosen by op and target kind."""

from .rules import schedule_for

__all__ = ["schedule_for"]
