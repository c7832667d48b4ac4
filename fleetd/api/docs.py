"""The API's documentation page (Swagger UI, served from the local bundle) under a strict CSP.

flask-smorest's own page starts Swagger UI from an inline script, which a CSP without
'unsafe-inline' blocks; this page loads the same bundle and starts it from a file of ours.
"""

import swagger_ui_bundle
from flask import Blueprint, Response, send_from_directory

blp = Blueprint("api-docs-ui", __name__)

# Swagger UI sets styles from its scripts and draws icons as data: images.
CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' "
    "data:; connect-src 'self'; frame-ancestors 'none'; form-action 'self'; base-uri 'none'; "
    "object-src 'none'"
)

_PAGE = """<!DOCTYPE html>
<html lang="en">
<head>
  <meta charset="utf-8">
  <title>fleetd API</title>
  <link href="/api/docs/assets/swagger-ui.css" rel="stylesheet" type="text/css">
</head>
<body>
  <div id="swagger-ui-container"></div>
  <script src="/api/docs/assets/swagger-ui-standalone-preset.js"></script>
  <script src="/api/docs/assets/swagger-ui-bundle.js"></script>
  <script src="/api/docs/start.js"></script>
</body>
</html>
"""

_START = """window.addEventListener("load", function () {
  window.ui = SwaggerUIBundle({
    url: "/api/openapi.json", dom_id: "#swagger-ui-container", deepLinking: true
  });
});
"""


@blp.route("/api/docs")
def page():
    """Swagger UI for /api/openapi.json."""
    return Response(_PAGE, mimetype="text/html")


@blp.route("/api/docs/start.js")
def start():
    """The script that starts Swagger UI (a file, so that the CSP needs no inline scripts)."""
    return Response(_START, mimetype="text/javascript")


@blp.route("/api/docs/assets/<path:filename>")
def assets(filename):
    """Swagger UI's files, served locally so the docs work offline."""
    return send_from_directory(swagger_ui_bundle.swagger_ui_path, filename)


def add_headers(response):
    """A strict CSP, no framing and no sniffing on the documentation."""
    response.headers.setdefault("Content-Security-Policy", CSP)
    response.headers.setdefault("X-Frame-Options", "DENY")
    response.headers.setdefault("X-Content-Type-Options", "nosniff")
    response.headers.setdefault("Referrer-Policy", "same-origin")
    return response


blp.after_request(add_headers)
