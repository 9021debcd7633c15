"""`/docs`: the API as an interactive page (Swagger UI over the served `/openapi.json`), where a newcomer
can read every route and try one from the browser.

Swagger UI comes from a pinned Python package (`swagger-ui-bundle-v2`: its JavaScript and CSS as files)
and is served from this process, so the page works on a host that reaches no CDN, as the servers this
project runs on often cannot. Its files are read once, on the first request for each. The page's URLs
are relative, so it works behind a proxy that serves the API under a path prefix.
"""

from __future__ import annotations

from pathlib import Path

from aiohttp import web

from .responses import WholeResponse

PAGE = b"""<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>inferd API</title>
<link rel="icon" type="image/png" href="docs/favicon-32x32.png">
<link rel="stylesheet" href="docs/swagger-ui.css">
</head>
<body>
<div id="swagger-ui"></div>
<script src="docs/swagger-ui-bundle.js"></script>
<script>
window.ui = SwaggerUIBundle({url: "openapi.json", dom_id: "#swagger-ui", deepLinking: true});
</script>
</body>
</html>
"""

PAGE_FILES = {  # path -> (file in the package, content type)
    "/docs/swagger-ui.css": ("swagger-ui.css", b"text/css; charset=utf-8"),
    "/docs/swagger-ui-bundle.js": ("swagger-ui-bundle.js", b"text/javascript; charset=utf-8"),
    "/docs/favicon-32x32.png": ("favicon-32x32.png", b"image/png"),
}
_CACHED = (("Cache-Control", "public, max-age=86400"),)  # (the files change only with the package's version)


class ApiPage:
    """The page and its three files."""

    def __init__(self) -> None:
        self._files: dict[str, bytes] = {}

    async def page(self, request: web.BaseRequest) -> web.StreamResponse:
        return WholeResponse(200, PAGE, content_type=b"text/html; charset=utf-8")

    async def asset(self, request: web.BaseRequest) -> web.StreamResponse:
        name, content_type = PAGE_FILES[request.path]
        body = self._files.get(name)
        if body is None:
            body = self._files[name] = (_folder() / name).read_bytes()
        return WholeResponse(200, body, _CACHED, content_type=content_type)


def _folder() -> Path:
    from swagger_ui_bundle import swagger_ui_path  # type: ignore[import-untyped]  # (no type information shipped)

    return Path(str(swagger_ui_path))
