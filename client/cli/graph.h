/* graph.h - reading a convolution-gradient op from a oneDNN Graph /
 * benchdnn graph JSON file (tests/benchdnn/inputs/graph/op/ files:
 * {"graph": [{"kind": .., "attrs": {NAME: {"type": .., "value": ..}},
 * "inputs": [logical tensors], "outputs": [..]}]}). */
#ifndef CGC_GRAPH_H
#define CGC_GRAPH_H

#include <stddef.h>

#include "spec.h"

/* Loads op number `index` among the file's convolution-gradient ops (0:
 * the first) into s: op, dtype, attributes and input dims. Both spec
 * generations' names are accepted (filter_format, filter_shape,
 * output_shape); a missing dst_shape / weights_shape is taken from the
 * op's output tensor. Logical tensors must be dense row-major ("stride"
 * checked when present). Returns 0 or CG_EINVAL / CG_ENOMEM with err
 * naming the file and the offending field. */
int cgc_graph_load(const char *path, int index, cgc_spec *s, char *err,
                   size_t errlen);

#endif
