"""The image-set writer's old module name: everything lives in `vlctl.data.imageset`."""

from vlctl.data.imageset import (  # noqa: F401
    Chunk,
    check_image_set,
    check_set_config,
    open_image_set_files,
    read_labels,
    write_image_set,
    write_pngs,
)
