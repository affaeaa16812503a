// Python exception types for FlashTile's typed C++ errors.
#pragma once

#include <nanobind/nanobind.h>

namespace flashtile::python {

// Creates flashtile.FlashTileError and its subclasses in module `m` and registers a translator so that
// every flashtile::Error thrown through a binding arrives as the matching Python exception, message intact.
void register_errors(nanobind::module_& m);

}  // namespace flashtile::python
