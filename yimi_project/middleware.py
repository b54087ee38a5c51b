"""The shape of Yimi's own middleware: a look at the request before the view, nothing after."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from asgiref.sync import iscoroutinefunction, markcoroutinefunction

if TYPE_CHECKING:  # settings.py imports a subclass's module (proxy.py): keep this light
    from django.http import HttpRequest, HttpResponseBase


class BeforeViewMiddleware:
    """Runs ``before(request)`` ahead of the rest of the stack: a response it returns is the
    answer, ``None`` goes on. Sync and async, so the stack never switches modes for it;
    ``before`` must not do I/O (it runs on the event loop under daphne)."""

    sync_capable = True
    async_capable = True

    def __init__(self, get_response: Callable[[HttpRequest], Any]) -> None:
        self.get_response = get_response
        self.is_async = iscoroutinefunction(get_response)
        if self.is_async:
            markcoroutinefunction(self)

    def before(self, request: HttpRequest) -> HttpResponseBase | None:
        raise NotImplementedError

    def __call__(self, request: HttpRequest) -> HttpResponseBase | Awaitable[HttpResponseBase]:
        answer = self.before(request)
        if self.is_async:
            return self._acall(request, answer)
        return answer if answer is not None else self.get_response(request)

    async def _acall(self, request: HttpRequest, answer: HttpResponseBase | None) -> HttpResponseBase:
        return answer if answer is not None else await self.get_response(request)
