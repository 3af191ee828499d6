/* names.c - the spellings of ops, dtypes, formats and auto_pad modes, and
 * the names of each op's inputs and output. Owns every string that maps to
 * one of problem.h's enums; nothing else in the library compares names. */
#include <string.h>
#include <strings.h>

#include "cg/problem.h"

/* Every accepted spelling, canonical first. The older spec generation
 * names the ops ...BackpropData / ...BackpropFilters; both generations may
 * carry a "-1" version suffix. */
static const char *const op_names[CG_OP_ALL_COUNT + 1][5] = {
    {NULL},
    {"ConvolutionBackwardData", "ConvolutionBackwardData-1",
     "ConvolutionBackpropData", "ConvolutionBackpropData-1", NULL},
    {"ConvolutionBackwardWeights", "ConvolutionBackwardWeights-1",
     "ConvolutionBackpropFilters", "ConvolutionBackpropFilters-1", NULL},
    {"ConvTransposeBackwardData", "ConvTransposeBackwardData-1",
     "ConvTransposeBackpropData", "ConvTransposeBackpropData-1", NULL},
    {"ConvTransposeBackwardWeights", "ConvTransposeBackwardWeights-1",
     "ConvTransposeBackpropFilters", "ConvTransposeBackpropFilters-1", NULL},
    {"ConvolutionBackward", NULL},
    {"ConvTransposeBackward", NULL},
};

static const char *const dtype_names[] = {NULL, "f32", "bf16", "f16"};
static const char *const data_format_names[] = {NULL, "NCX", "NXC"};
static const char *const weights_format_names[] = {NULL, "OIX", "XIO", "IOX",
                                                   "XOI"};
static const char *const auto_pad_names[] = {"none", "same_upper", "same_lower",
                                             "valid"};
static const char *const grad_names[] = {"diff_src", "diff_weights",
                                         "diff_bias"};

#define COUNT(a) ((int)(sizeof(a) / sizeof((a)[0])))

/* Index of name in table[first..n), exact or case-insensitive; -1 if absent. */
static int lookup(const char *const *table, int first, int n, const char *name,
                  int any_case) {
  if (name == NULL)
    return -1;
  for (int i = first; i < n; i++) {
    if (any_case ? strcasecmp(table[i], name) == 0
                 : strcmp(table[i], name) == 0)
      return i;
  }
  return -1;
}

int cg_op_parse(const char *name, cg_op *out) {
  if (name == NULL)
    return CG_EINVAL;
  for (int op = 1; op <= CG_OP_ALL_COUNT; op++) {
    for (const char *const *a = op_names[op]; *a != NULL; a++) {
      if (strcmp(*a, name) == 0) {
        *out = (cg_op)op;
        return 0;
      }
    }
  }
  return CG_EINVAL;
}

int cg_dtype_parse(const char *name, cg_dtype *out) {
  int i = lookup(dtype_names, 1, COUNT(dtype_names), name, 0);
  if (i < 0)
    return CG_EINVAL;
  *out = (cg_dtype)i;
  return 0;
}

int cg_data_format_parse(const char *name, cg_data_format *out) {
  int i = lookup(data_format_names, 1, COUNT(data_format_names), name, 0);
  if (i < 0)
    return CG_EINVAL;
  *out = (cg_data_format)i;
  return 0;
}

int cg_weights_format_parse(const char *name, cg_weights_format *out) {
  int i = lookup(weights_format_names, 1, COUNT(weights_format_names), name, 0);
  if (i < 0)
    return CG_EINVAL;
  *out = (cg_weights_format)i;
  return 0;
}

/* The docs write lower case, oneDNN's schema "None"/"SAME_UPPER": any case. */
int cg_auto_pad_parse(const char *name, cg_auto_pad *out) {
  int i = lookup(auto_pad_names, 0, COUNT(auto_pad_names), name, 1);
  if (i < 0)
    return CG_EINVAL;
  *out = (cg_auto_pad)i;
  return 0;
}

const char *cg_op_name(cg_op op) {
  return op >= 1 && op <= CG_OP_ALL_COUNT ? op_names[op][0] : "?";
}

const char *cg_dtype_name(cg_dtype dt) {
  return dt >= 1 && (int)dt < COUNT(dtype_names) ? dtype_names[dt] : "?";
}

const char *cg_data_format_name(cg_data_format f) {
  return f >= 1 && (int)f < COUNT(data_format_names) ? data_format_names[f]
                                                     : "?";
}

const char *cg_weights_format_name(cg_weights_format f) {
  return f >= 1 && (int)f < COUNT(weights_format_names)
             ? weights_format_names[f]
             : "?";
}

const char *cg_auto_pad_name(cg_auto_pad a) {
  return (int)a >= 0 && (int)a < COUNT(auto_pad_names) ? auto_pad_names[a]
                                                       : "?";
}

const char *const *cg_op_aliases(cg_op op) {
  static const char *const none[] = {NULL};
  return op >= 1 && op <= CG_OP_ALL_COUNT ? op_names[op] : none;
}

const char *cg_grad_name(cg_grad g) {
  return (int)g >= 0 && (int)g < COUNT(grad_names) ? grad_names[g] : NULL;
}

int cg_grad_parse(const char *name, cg_grad *out) {
  int i = lookup(grad_names, 0, COUNT(grad_names), name, 0);
  if (i < 0)
    return CG_EINVAL;
  *out = (cg_grad)i;
  return 0;
}

size_t cg_dtype_size(cg_dtype dt) {
  switch (dt) {
  case CG_DTYPE_F32:
    return 4;
  case CG_DTYPE_BF16:
  case CG_DTYPE_F16:
    return 2;
  default:
    return 0;
  }
}

const char *cg_op_input_name(cg_op op, int index) {
  switch (op) {
  case CG_OP_CONV_BWD_DATA:
    return index == 0   ? "diff_dst"
           : index == 1 ? "weights"
           : index == 2 ? "dst_shape"
                        : NULL;
  case CG_OP_DECONV_BWD_DATA:
    return index == 0 ? "diff_dst" : index == 1 ? "weights" : NULL;
  case CG_OP_CONV_BWD_WEIGHTS:
  case CG_OP_DECONV_BWD_WEIGHTS:
    return index == 0   ? "src"
           : index == 1 ? "diff_dst"
           : index == 2 ? "weights_shape"
                        : NULL;
  case CG_OP_CONV_BWD:
  case CG_OP_DECONV_BWD:
    return index == 0   ? "src"
           : index == 1 ? "diff_dst"
           : index == 2 ? "weights"
                        : NULL;
  default:
    return NULL;
  }
}

const char *cg_op_output_name(cg_op op) {
  if (op < 1 || op > CG_OP_COUNT)
    return NULL;
  return cg_op_outputs_weights(op) ? "diff_weights" : "diff_src";
}

int cg_op_is_layer(cg_op op) {
  return op == CG_OP_CONV_BWD || op == CG_OP_DECONV_BWD;
}

int cg_op_outputs_weights(cg_op op) {
  return op == CG_OP_CONV_BWD_WEIGHTS || op == CG_OP_DECONV_BWD_WEIGHTS;
}
