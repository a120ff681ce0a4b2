"""Session tracking: which conversation a request belongs to, its turn type, and next states.

Pure logic, no IO: the API feeds requests in and writes what comes out to the store.
"""
