x = 1  # TODO: name
