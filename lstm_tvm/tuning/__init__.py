"""Tuning with MetaSchedule: sessions, task extraction, databases under ``schedules/``."""

from .database import database_dir, records_key, tuned_blocks
from .session import TaskResult, collect_tasks, tune
from .tasks import Task, kernel_gemms

__all__ = [
           "Task",
           "TaskResult",
           "collect_tasks",
           "database_dir",
           "kernel_gemms",
           "records_key",
           "tune",
           "tuned_blocks",
]
