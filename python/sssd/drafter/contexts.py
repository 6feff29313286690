"""The request contexts a Python drafter keeps (``MergedDrafter``, ``ModelDrafter``): token lists by
request id, and the queries of the drafter API about them."""

from __future__ import annotations

from typing import Any

from sssd.checks import check_int
from sssd.drafter.retrieval import UnknownRequestError


class RequestContexts:
    """``self._ctx``: request id -> its tokens (prompt + accepted output), as the drafter knows them."""

    def __init__(self) -> None:
        self._ctx: dict[int, list[int]] = {}

    def _known(self, rid: Any) -> int:
        rid = check_int(rid, "rid")
        if rid not in self._ctx:
            raise UnknownRequestError(f"unknown request id {rid}")
        return rid

    def has_request(self, rid: int) -> bool:
        return check_int(rid, "rid") in self._ctx

    def __len__(self) -> int:
        return len(self._ctx)

    def context_length(self, rid: int) -> int:
        return len(self._ctx[self._known(rid)])
