"""The web dashboard's static page: ``index.html``, ``app.js`` and ``app.css``, served by
``aenv.api.dashboard`` at ``/dashboard`` (docs/dashboard.md). Plain HTML, CSS and JavaScript,
no framework, no build step and nothing fetched from anywhere but the node (or gateway) that
serves it. The page signs in with an API key kept in the tab's ``sessionStorage`` and calls
the node's E2B routes with it as ``X-API-KEY``. No Python here: the files are package data."""
