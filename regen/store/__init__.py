"""The store: the ``dqa regen`` output folder (``folder``: run.json, paths), its shards (``shards``),
the durable journal they are compacted from (``journal``) and the copy to an object store (``upload``).
"""
