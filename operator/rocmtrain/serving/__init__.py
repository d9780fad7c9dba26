"""What the operator's two HTTPS servers (the progress endpoint, `/metrics`) share.

- `errors`: the refusals, each carrying its HTTP answer;
- `reviews`: asking the API server about a bearer token (TokenReview, SubjectAccessReview), within a budget;
- `rate`: token buckets per key;
- `site`: an aiohttp application served over TLS within connection bounds.
"""
