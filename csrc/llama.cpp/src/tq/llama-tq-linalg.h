// llama-tq: the small dense linear algebra of the key basis (llama-tq-keys.cpp): symmetric eigendecomposition,
// Cholesky, triangular inverse. Row-major double matrices of n x n; n is a head size (<= 576), done once per
// (layer, KV head) when a cache is created.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <vector>

namespace llama_tq_linalg {

using mat = std::vector<double>;  // row-major n x n

inline mat matmul(const mat & a, const mat & b, size_t n) {
    mat c(n * n, 0.0);
    for (size_t i = 0; i < n; ++i) {
        for (size_t k = 0; k < n; ++k) {
            const double x = a[i * n + k];
            if (x == 0.0) {
                continue;
            }
            for (size_t j = 0; j < n; ++j) {
                c[i * n + j] += x * b[k * n + j];
            }
        }
    }
    return c;
}

inline mat transpose(const mat & a, size_t n) {
    mat t(n * n);
    for (size_t i = 0; i < n; ++i) {
        for (size_t j = 0; j < n; ++j) {
            t[j * n + i] = a[i * n + j];
        }
    }
    return t;
}

// Eigenvalues w and eigenvectors (the columns of v) of the symmetric matrix a: Householder reduction to tridiagonal
// form, then the QL method with implicit shifts (EISPACK's tred2/tql2).
inline void sym_eig(const mat & a, size_t n, std::vector<double> & w, mat & v) {
    v = a;
    w.assign(n, 0.0);
    std::vector<double> e(n, 0.0);
    auto V = [&](size_t i, size_t j) -> double & { return v[i * n + j]; };
    for (size_t j = 0; j < n; ++j) {
        w[j] = V(n - 1, j);
    }
    for (size_t i = n - 1; i > 0; --i) {  // tred2
        double scale = 0.0, h = 0.0;
        for (size_t k = 0; k < i; ++k) {
            scale += std::fabs(w[k]);
        }
        if (scale == 0.0) {
            e[i] = w[i - 1];
            for (size_t j = 0; j < i; ++j) {
                w[j] = V(i - 1, j);
                V(i, j) = 0.0;
                V(j, i) = 0.0;
            }
        } else {
            for (size_t k = 0; k < i; ++k) {
                w[k] /= scale;
                h += w[k] * w[k];
            }
            double f = w[i - 1];
            double g = f > 0 ? -std::sqrt(h) : std::sqrt(h);
            e[i] = scale * g;
            h -= f * g;
            w[i - 1] = f - g;
            for (size_t j = 0; j < i; ++j) {
                e[j] = 0.0;
            }
            for (size_t j = 0; j < i; ++j) {
                f = w[j];
                V(j, i) = f;
                g = e[j] + V(j, j) * f;
                for (size_t k = j + 1; k < i; ++k) {
                    g += V(k, j) * w[k];
                    e[k] += V(k, j) * f;
                }
                e[j] = g;
            }
            f = 0.0;
            for (size_t j = 0; j < i; ++j) {
                e[j] /= h;
                f += e[j] * w[j];
            }
            const double hh = f / (h + h);
            for (size_t j = 0; j < i; ++j) {
                e[j] -= hh * w[j];
            }
            for (size_t j = 0; j < i; ++j) {
                f = w[j];
                g = e[j];
                for (size_t k = j; k < i; ++k) {
                    V(k, j) -= f * e[k] + g * w[k];
                }
                w[j] = V(i - 1, j);
                V(i, j) = 0.0;
            }
        }
        w[i] = h;
    }
    for (size_t i = 0; i + 1 < n; ++i) {  // accumulate the transformations
        V(n - 1, i) = V(i, i);
        V(i, i) = 1.0;
        const double h = w[i + 1];
        if (h != 0.0) {
            for (size_t k = 0; k <= i; ++k) {
                w[k] = V(k, i + 1) / h;
            }
            for (size_t j = 0; j <= i; ++j) {
                double g = 0.0;
                for (size_t k = 0; k <= i; ++k) {
                    g += V(k, i + 1) * V(k, j);
                }
                for (size_t k = 0; k <= i; ++k) {
                    V(k, j) -= g * w[k];
                }
            }
        }
        for (size_t k = 0; k <= i; ++k) {
            V(k, i + 1) = 0.0;
        }
    }
    for (size_t j = 0; j < n; ++j) {
        w[j] = V(n - 1, j);
        V(n - 1, j) = 0.0;
    }
    V(n - 1, n - 1) = 1.0;
    e[0] = 0.0;
    for (size_t i = 1; i < n; ++i) {  // tql2
        e[i - 1] = e[i];
    }
    e[n - 1] = 0.0;
    double f = 0.0, tst1 = 0.0;
    const double eps = std::ldexp(1.0, -52);
    for (size_t l = 0; l < n; ++l) {
        tst1 = std::max(tst1, std::fabs(w[l]) + std::fabs(e[l]));
        size_t m = l;
        while (m < n - 1 && std::fabs(e[m]) > eps * tst1) {
            ++m;
        }
        if (m > l) {
            for (int iter = 0; iter < 64 && std::fabs(e[l]) > eps * tst1; ++iter) {
                double g = w[l];
                double p = (w[l + 1] - g) / (2.0 * e[l]);
                double r = std::hypot(p, 1.0);
                if (p < 0) {
                    r = -r;
                }
                w[l] = e[l] / (p + r);
                w[l + 1] = e[l] * (p + r);
                const double dl1 = w[l + 1];
                double h = g - w[l];
                for (size_t i = l + 2; i < n; ++i) {
                    w[i] -= h;
                }
                f += h;
                p = w[m];
                double c = 1.0, c2 = 1.0, c3 = 1.0, s = 0.0, s2 = 0.0;
                const double el1 = e[l + 1];
                for (size_t ii = m; ii-- > l;) {
                    c3 = c2;
                    c2 = c;
                    s2 = s;
                    g = c * e[ii];
                    h = c * p;
                    r = std::hypot(p, e[ii]);
                    e[ii + 1] = s * r;
                    s = e[ii] / r;
                    c = p / r;
                    p = c * w[ii] - s * g;
                    w[ii + 1] = h + s * (c * g + s * w[ii]);
                    for (size_t k = 0; k < n; ++k) {
                        h = V(k, ii + 1);
                        V(k, ii + 1) = s * V(k, ii) + c * h;
                        V(k, ii) = c * V(k, ii) - s * h;
                    }
                }
                p = -s * s2 * c3 * el1 * e[l] / dl1;
                e[l] = s * p;
                w[l] = c * p;
            }
        }
        w[l] += f;
        e[l] = 0.0;
    }
}

// Lower-triangular l with l l^T = a (a symmetric positive definite); false if it is not.
inline bool cholesky(const mat & a, size_t n, mat & l) {
    l.assign(n * n, 0.0);
    for (size_t j = 0; j < n; ++j) {
        double d = a[j * n + j];
        for (size_t k = 0; k < j; ++k) {
            d -= l[j * n + k] * l[j * n + k];
        }
        if (!(d > 0.0)) {
            return false;
        }
        l[j * n + j] = std::sqrt(d);
        for (size_t i = j + 1; i < n; ++i) {
            double s = a[i * n + j];
            for (size_t k = 0; k < j; ++k) {
                s -= l[i * n + k] * l[j * n + k];
            }
            l[i * n + j] = s / l[j * n + j];
        }
    }
    return true;
}

// The inverse of a lower-triangular matrix (lower-triangular too).
inline mat lower_inverse(const mat & l, size_t n) {
    mat x(n * n, 0.0);
    for (size_t j = 0; j < n; ++j) {
        x[j * n + j] = 1.0 / l[j * n + j];
        for (size_t i = j + 1; i < n; ++i) {
            double s = 0.0;
            for (size_t k = j; k < i; ++k) {
                s += l[i * n + k] * x[k * n + j];
            }
            x[i * n + j] = -s / l[i * n + i];
        }
    }
    return x;
}

}  // namespace llama_tq_linalg
