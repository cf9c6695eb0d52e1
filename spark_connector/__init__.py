"""Reserved for the Spark structured-streaming source over the fetch API (a later issue).

Empty on purpose: it will depend only on ``commitlog``'s record format and HTTP, never on the
broker.
"""
