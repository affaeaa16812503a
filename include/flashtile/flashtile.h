// Umbrella header.
#pragma once

#include "flashtile/attention.h"
#include "flashtile/dispatch.h"
#include "flashtile/errors.h"
#include "flashtile/kvcache.h"
#include "flashtile/merge.h"
#include "flashtile/options.h"
#include "flashtile/reference.h"
#include "flashtile/tensor.h"
#include "flashtile/types.h"
