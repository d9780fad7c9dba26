"""The progress endpoint: training drivers push `ProgressReport`s, the operator writes them to status.

Modules: `server` (aiohttp app factory and the running server), `auth`
(TokenReview authentication, pod-based authorisation), `limits` (body bounds),
`store` (job reads and status patches), `tls` (the operator-managed CA and
serving certificate, and the CA ConfigMap in job namespaces). The report's merge
patch of the status is pure: `rocmtrain.status.progress_patch`; the refusals, token
reviews, rate limits and TLS site are shared with `/metrics`: `rocmtrain.serving`.
"""
