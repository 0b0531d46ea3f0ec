"""Tuning with MetaSchedule: sessions, task extraction, databases under ``schedules/``."""

from .database import tuned_blocks, database_dir, target_key
from .session import TaskResult, collect_tasks, tune
from .tasks import Task, kernel_gemms

__all__ = ["tune", "collect_tasks", "TaskResult", "Task", "kernel_gemms", "tuned_blocks",
           "database_dir", "target_key"]
