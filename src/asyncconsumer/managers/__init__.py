"""Sans-I/O request managers: each owns one concern's state and requests.

A manager never touches a socket or sleeps.  The background loop calls
``poll(now)`` to collect ``UnsentRequest``s and ``next_deadline(now)`` to know
when to poll again; responses come back through the requests' handlers.
Tests drive managers with scripted responses and a fake clock.
"""
