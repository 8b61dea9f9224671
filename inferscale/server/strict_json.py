"""Request bodies read as strict JSON: an object that names a key twice is refused with 400 ``invalid_input``.

JSON keeps the last value of a repeated key, so ``{"user_id": "u1", "user_id": "u2"}`` stored a memory under
``u2``, while a proxy, an audit log or an authorisation layer that keeps the first one sees ``u1`` (a tester's find;
the server already refused a query parameter given twice). :class:`StrictJSONRoute` is the route class of every
router of the server: FastAPI parses a JSON body through the request's ``json()``, which here is
:func:`inferscale.json_text.loads_json` with ``unique_keys=True``; its error reaches the client as a body that is not
valid JSON, naming the key. Nesting too deep for Python's parser is refused the same way.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import Request, Response
from fastapi.routing import APIRoute

from inferscale.json_text import loads_json

__all__ = ["StrictJSONRequest", "StrictJSONRoute"]


class StrictJSONRequest(Request):
    """A request whose JSON body is parsed by :func:`~inferscale.json_text.loads_json` with ``unique_keys``."""

    async def json(self) -> Any:
        """The body as JSON, parsed once.

        Raises:
            json.JSONDecodeError: for a body that is not JSON, nests too deep, or names a key twice in one object.
        """
        if not hasattr(self, "_json"):
            self._json = loads_json(await self.body(), unique_keys=True)
        return self._json


class StrictJSONRoute(APIRoute):
    """An API route that hands its endpoint a :class:`StrictJSONRequest` (FastAPI's custom route class)."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def strict(request: Request) -> Response:
            return await handler(StrictJSONRequest(request.scope, request.receive))

        return strict
