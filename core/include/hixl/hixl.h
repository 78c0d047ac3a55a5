/* hixl: everything a user needs, in one include. */
#ifndef HIXL_H
#define HIXL_H
#include "hixl/hixl_status.h"
#include "hixl/hixl_engine.h"
#include "hixl/hixl_cs.h"
#include "hixl/hixl_cache.h"
#include "hixl/hccn_rping.h"
#endif
