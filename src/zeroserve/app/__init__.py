"""HTTP meaning without sockets: routing, request/response types, endpoints, error bodies."""

from .application import App
from .request import Request
from .response import Response, StreamResponse, json_response

__all__ = ["App", "Request", "Response", "StreamResponse", "json_response"]
