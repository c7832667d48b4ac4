"""How the views of jobs and instances answer with a whole output: streamed text, gzip when
asked."""

from flask import Response, request, stream_with_context


def gzip_asked(query):
    """The output query's terms for the service, gzip on when the client accepts it."""
    accepts = "gzip" in request.headers.get("Accept-Encoding", "")
    return dict(query, gzip=bool(query.get("gzip")) or accepts)


def text_stream(pieces, query):
    """A streamed text/plain answer of `pieces` (gzip-compressed when they are)."""
    gzip = bool(query.get("gzip")) or "gzip" in request.headers.get("Accept-Encoding", "")
    response = Response(stream_with_context(pieces), mimetype="text/plain")
    if gzip:
        if query.get("gzip"):
            response.mimetype = "application/gzip"
        else:
            response.headers["Content-Encoding"] = "gzip"
        response.headers["Vary"] = "Accept-Encoding"
    return response
