"""Errors raised in a data-loader worker process, as the main process sees them.

torch hands a worker's exception to the main process as its type and its formatted traceback
(``torch.utils.data._utils.ExceptionWrapper``) and raises ``exc_type(report)`` there, where
``report`` is "Caught <Name> in DataLoader worker process <n>.\\nOriginal Traceback ...", the
whole traceback, which ends with "<module>.<Name>: <message>". An exception class that derives
from ``OneMessageError`` takes exactly one argument, the message, and takes the message back
out of such a report: the error a user sees is the same with 0, 1 or N workers.
"""
import re

_REPORT_START = re.compile(r"Caught \w+ in [^\n]*\.\nOriginal Traceback")


def message_in_worker_report(text: str, exc_type: type) -> str:
    """The message ``exc_type`` was raised with in a loader worker, if ``text`` is torch's
    report of it; any other ``text`` as it is."""
    text = str(text)
    if not _REPORT_START.match(text):
        return text
    module = exc_type.__module__
    name = exc_type.__qualname__ if module in ("builtins", "__main__") \
        else f"{module}.{exc_type.__qualname__}"
    header = f"\n{name}: "
    start = text.rfind(header)
    return text[start + len(header):].rstrip("\n") if start >= 0 else text


class OneMessageError:
    """Base of an exception class built from one message: the same message when raised in a
    data-loader worker and re-raised by torch in the main process. List it before the built-in
    exception class: ``class E(OneMessageError, OSError)``."""

    def __init__(self, message: str):
        super().__init__(message_in_worker_report(message, type(self)))
