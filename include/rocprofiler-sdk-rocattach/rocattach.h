/* Source compatibility with ROCm: programs include
 * <rocprofiler-sdk-rocattach/rocattach.h>. */
#include "../rocattach.h"
