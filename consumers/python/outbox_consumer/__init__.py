"""Exactly-once consumer for outbox-relay events (Python twin of ``crates/outbox-consumer``).

Each event is applied once in the service's PostgreSQL database: a ledger row keyed by
``(service, event id)`` is inserted in the handler's own transaction, and the message is acked
only after ``COMMIT``. See docs/consumers.md.
"""

from . import contract
from .consumer import Consumer, ConsumerError, Permanent, Reapply, StartAt, Stats
from .contract import format_lsn, parse_lsn
from .event import Event, InvalidMessage
from .ledger import LEDGER_MIGRATION, ensure_ledger, prune_ledger
from .position import Limits, Position, locate
from .schema import (
    ContractRefused,
    ContractUnavailable,
    ContractValidator,
    EventContract,
    Violation,
)

__all__ = [
    "Consumer",
    "ConsumerError",
    "ContractRefused",
    "ContractUnavailable",
    "ContractValidator",
    "Event",
    "EventContract",
    "InvalidMessage",
    "LEDGER_MIGRATION",
    "Limits",
    "Permanent",
    "Position",
    "Reapply",
    "StartAt",
    "Stats",
    "Violation",
    "contract",
    "ensure_ledger",
    "format_lsn",
    "locate",
    "parse_lsn",
    "prune_ledger",
]
