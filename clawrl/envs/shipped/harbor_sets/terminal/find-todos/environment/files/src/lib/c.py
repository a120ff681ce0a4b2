# TODO tests
