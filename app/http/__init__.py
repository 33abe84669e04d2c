"""The HTTP layer: everything that knows about FastAPI and Starlette except the routers.

Problem rendering, middleware, the request dependencies (settings, principal, unit of work),
precondition headers, pagination parameters, path and query parameter types, idempotency
headers. Slices' routers use these; `app/core` and the services never import FastAPI.
"""
