def slugify(title):
    return title.replace(' ', '-')
