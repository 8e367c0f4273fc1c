"""The wire: every HTTP request dqa regen makes, the same for every server kind (``call``, ``outcome``),
over aiohttp under the ``transport.Transport`` seam, with one TLS/proxy policy and no credentials shown.
"""
