"""Finds the forum-style accumulation patterns in Python source, without running it.

Reads source with `ast` (no TensorFlow import) and follows names through a
module's assignments, scope by scope as Python resolves them (a function,
lambda or comprehension sees its own names first, then those of the functions
around it, then the module's), tagging what each value is made from: a zero
non-trainable variable (an accumulator), the result of its ``assign_add``, a
float counter variable, a placeholder, the global step.
The rules then look at what reaches ``apply_gradients`` and ``tf.cond``.
It is a heuristic: it finds the patterns as they are usually written, and
says nothing about code it cannot follow.
"""

import ast
import os
import re
import typing


class Finding(typing.NamedTuple):
    """One problem found in a file.

    Attributes:
        path: The file, as given (or found under a directory given).
        line: 1-based line number.
        rule: The rule's code, ``"TFA001"`` to ``"TFA007"``, or ``"TFA000"``
            for a file that cannot be read or parsed.
        message: What is wrong, then ``"; "``, then the tf1_accum replacement.
    """

    path: str
    line: int
    rule: str
    message: str

    def __str__(self):
        return f"{self.path}:{self.line}: {self.rule} {self.message}"


#: Rule code -> (pattern, what is wrong; the tf1_accum replacement).
RULES = {
    "TFA001": (
        "(a) sums applied",
        "apply_gradients gets the accumulated sums, not their mean: with SGD or momentum "
        "the update is N times the large-batch update; use "
        "tf1_accum.build_accumulation(loss, optimizer), whose apply_op applies the mean",
    ),
    "TFA002": (
        "(b) divided by a counter variable",
        "accumulators divided by a counter variable: every micro-batch weighs the same "
        "whatever its size, and an apply with the counter at 0 turns every weight into NaN; "
        "use tf1_accum.build_accumulation(loss, optimizer, weight=<examples in the "
        "micro-batch>), whose apply_op refuses an empty window",
    ),
    "TFA003": (
        "(c) apply computed from the assign_add ops",
        "the gradients given to apply_gradients are computed from the assign_add ops, so "
        "each run of the apply accumulates its feed again (fed the last micro-batch, it "
        "counts it twice); use tf1_accum.build_accumulation: its apply_op reads the "
        "accumulators and needs no feed (fused=True saves the extra run)",
    ),
    "TFA004": (
        "(d) gradients through placeholders",
        "gradients fed back through placeholders: each micro-batch copies every gradient "
        "to Python and back; use tf1_accum.build_accumulation with "
        "tf1_accum.run_accumulation, which keep them in the graph",
    ),
    "TFA005": (
        "(e) running average keyed on the global step",
        "running average of gradients keyed on the global step, which never resets: each "
        "update applies the mean of every gradient since training began; use "
        "tf1_accum.build_accumulation(loss, optimizer, global_step=global_step), which "
        "averages each window alone and counts updates",
    ),
    "TFA006": (
        "(f) tf.cond that accumulates or applies",
        "tf.cond that accumulates or applies: the run that applies does not accumulate its "
        "micro-batch, and the optimizer's slots are built inside the conditional; use "
        "tf1_accum.AccumulationOptimizer(optimizer, steps=N), whose train op accumulates "
        "every micro-batch and applies every N-th",
    ),
    "TFA007": (
        "(a) initialized_value()",
        "Variable.initialized_value() raises NotImplementedError on resource variables "
        "(TensorFlow 2 graph mode without disable_v2_behavior()); use "
        "tf1_accum.build_accumulation, which creates its accumulators for both kinds of "
        "variable",
    ),
}

_ACC = "acc"  # a zero, non-trainable variable: (_ACC, node position)
_SUM_OP = "sum_op"  # the sum an accumulator's assign_add returns (scaling removes it)
_RERUN = "rerun"  # computed from an accumulator's assign_add: running it accumulates again
_COUNTER = "counter"  # a float variable: (_COUNTER, node position)
_COUNTER_MEAN = "counter_mean"
_PLACEHOLDER = "placeholder"
_STEP = "global_step"
_STEP_FUNCTIONS = {"get_or_create_global_step", "get_global_step", "create_global_step"}
_SCALING = (ast.Div, ast.FloorDiv, ast.Mult)
_GRADIENT_FUNCTIONS = {"compute_gradients", "gradients"}


def _called_name(call):
    """The last name of what a call calls: ``tf.train.Foo(...)`` -> ``"Foo"``."""
    func = call.func
    if isinstance(func, ast.Attribute):
        return func.attr
    if isinstance(func, ast.Name):
        return func.id
    return None


def _function_form(call):
    """``tf.assign_add(ref, value)`` rather than ``ref.assign_add(value)``."""
    return not isinstance(call.func, ast.Attribute) or len(call.args) >= 2


def _calls(nodes, names):
    return any(
        isinstance(node, ast.Call) and _called_name(node) in names
        for root in nodes
        for node in ast.walk(root)
    )


def _argument(call, index, *keywords):
    if len(call.args) > index and not isinstance(call.args[index], ast.Starred):
        return call.args[index]
    for keyword in call.keywords:
        if keyword.arg in keywords:
            return keyword.value
    return None


_FUNCTION_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)
_COMPREHENSIONS = (ast.ListComp, ast.SetComp, ast.GeneratorExp, ast.DictComp)


class _Scope:
    """One scope's names, as Python scopes them: a module, class, function,
    lambda or comprehension."""

    def __init__(self, parent=None, kind="function"):
        self.parent = parent
        self.kind = kind  # "module", "class", "function" or "comprehension"
        self.local = set()  # names bound in this scope (parameters included)
        self.declared_global = set()
        self.declared_nonlocal = set()
        self.values = {}  # name -> expressions assigned to it in this scope
        self.functions = {}  # name -> function definitions of that name here


class _Module:
    """The assignments of one module, scope by scope, and the tags of its expressions."""

    def __init__(self, tree):
        self.tree = tree
        self.root = _Scope(kind="module")
        self._scope_of = {}  # id(node) -> the scope the node is evaluated in
        self._bindings = []  # (scope, target, value), bound once every scope's names are known
        self._mutations = []  # (scope, name, value): xs.append(v), xs.attr = v, xs[i] = v
        self._busy = set()
        self._cache = {}
        self._visit(tree, self.root)
        for scope, target, value in self._bindings:
            self._bind(target, value, scope)
        for scope, name, value in self._mutations:
            self._resolve(scope, name).values.setdefault(name, []).append(value)
        self.summed = set()  # accumulators that some assign_add adds to
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and _called_name(node) == "assign_add":
                self.summed |= {t for t in self._receiver_tags(node) if t[0] == _ACC}

    # -- the scopes and what is bound in each ---------------------------------

    def _visit_all(self, nodes, scope):
        for node in nodes:
            if node is not None:
                self._visit(node, scope)

    def _visit(self, node, scope):
        self._scope_of[id(node)] = scope
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            # Decorators, defaults and annotations run in the enclosing scope.
            arguments = node.args
            outer = list(arguments.defaults) + [d for d in arguments.kw_defaults if d]
            if not isinstance(node, ast.Lambda):
                scope.local.add(node.name)
                scope.functions.setdefault(node.name, []).append(node)
                outer += node.decorator_list + [node.returns]
                outer += [a.annotation for a in self._parameters(arguments)]
            self._visit_all(outer, scope)
            inner = _Scope(scope)
            inner.local |= {a.arg for a in self._parameters(arguments)}
            body = [node.body] if isinstance(node, ast.Lambda) else node.body
            self._visit_all(body, inner)
            return
        if isinstance(node, ast.ClassDef):
            scope.local.add(node.name)
            self._visit_all(node.decorator_list + node.bases + node.keywords, scope)
            self._visit_all(node.body, _Scope(scope, "class"))
            return
        if isinstance(node, _COMPREHENSIONS):
            # The first iterable runs in the enclosing scope, the rest inside.
            inner = _Scope(scope, "comprehension")
            self._scope_of[id(node)] = inner
            for index, generator in enumerate(node.generators):
                self._scope_of[id(generator)] = inner
                self._visit(generator.iter, scope if index == 0 else inner)
                self._visit(generator.target, inner)
                self._visit_all(generator.ifs, inner)
                self._bindings.append((inner, generator.target, generator.iter))
            elements = [node.key, node.value] if isinstance(node, ast.DictComp) else [node.elt]
            self._visit_all(elements, inner)
            return
        if isinstance(node, ast.NamedExpr):
            # x := v in a comprehension binds x in the enclosing function.
            target_scope = scope
            while target_scope.kind == "comprehension":
                target_scope = target_scope.parent
            target_scope.local.add(node.target.id)
            self._scope_of[id(node.target)] = target_scope
            self._bindings.append((target_scope, node.target, node.value))
            self._visit(node.value, scope)
            return
        if isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load):
            scope.local.add(node.id)
        elif isinstance(node, ast.Global):
            scope.declared_global |= set(node.names)
        elif isinstance(node, ast.Nonlocal):
            scope.declared_nonlocal |= set(node.names)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            scope.local |= {(a.asname or a.name).split(".")[0] for a in node.names}
        elif isinstance(node, ast.ExceptHandler) and node.name:
            scope.local.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if node.value is not None:
                self._bindings += [(scope, target, node.value) for target in targets]
        elif isinstance(node, (ast.For, ast.AsyncFor)):
            self._bindings.append((scope, node.target, node.iter))
        elif isinstance(node, ast.withitem) and node.optional_vars is not None:
            self._bindings.append((scope, node.optional_vars, node.context_expr))
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in ("append", "extend")
            and isinstance(node.func.value, ast.Name)
            and node.args
        ):
            self._mutations.append((scope, node.func.value.id, node.args[0]))
        for child in ast.iter_child_nodes(node):
            self._visit(child, scope)

    @staticmethod
    def _parameters(arguments):
        extra = [a for a in (arguments.vararg, arguments.kwarg) if a is not None]
        return arguments.posonlyargs + arguments.args + arguments.kwonlyargs + extra

    def _resolve(self, scope, name):
        """The scope a name used in ``scope`` refers to, as Python resolves it."""
        current, first = scope, True
        while current.parent is not None:
            # A class body's names are not visible in the scopes nested in it.
            if first or current.kind != "class":
                if name in current.declared_global:
                    return self.root
                if name in current.local and name not in current.declared_nonlocal:
                    return current
            current, first = current.parent, False
        return self.root

    def _store_scope(self, scope, name):
        if name in scope.declared_global:
            return self.root
        if name in scope.declared_nonlocal and scope.parent is not None:
            return self._resolve(scope.parent, name)
        return scope

    def _bind(self, target, value, scope):
        if isinstance(target, (ast.Tuple, ast.List)):
            elements = target.elts
            if isinstance(value, (ast.Tuple, ast.List)) and len(value.elts) == len(elements):
                pairs = zip(elements, value.elts)  # a, b = x, y
            elif isinstance(value, ast.Call) and _called_name(value) == "zip":
                pairs = zip(elements, value.args) if len(value.args) == len(elements) else None
            elif isinstance(value, ast.Call) and _called_name(value) == "enumerate":
                pairs = (
                    [(elements[1], value.args[0])] if len(elements) == 2 and value.args else None
                )
            else:
                pairs = None
            if pairs is not None:
                for element, part in pairs:
                    self._bind(element, part, scope)
                return
        # Otherwise every name gets the whole value: coarse, but it keeps what
        # the value is made from. The names an attribute or item is set on
        # (``xs`` in ``xs.attr = v``, ``xs[i] = v``) are looked up, not bound.
        for node in ast.walk(target):
            if isinstance(node, ast.Name):
                if isinstance(node.ctx, ast.Load):
                    home = self._resolve(scope, node.id)
                else:
                    home = self._store_scope(scope, node.id)
                home.values.setdefault(node.id, []).append(value)

    def functions(self, name_node):
        """The function definitions a name refers to, where it is used."""
        scope = self._resolve(self._scope_of.get(id(name_node), self.root), name_node.id)
        return scope.functions.get(name_node.id, ())

    # -- the tags -------------------------------------------------------------

    def _receiver_tags(self, call):
        """Tags of the variable an assign method or function updates."""
        if _function_form(call):
            return self.tags(call.args[0]) if call.args else frozenset()
        return self.tags(call.func.value)

    def tags(self, node):
        # A name's tags are those of everything assigned to it in the scope it
        # refers to: one entry per name and scope keeps chains of names shallow.
        if isinstance(node, ast.Name):
            scope = self._resolve(self._scope_of.get(id(node), self.root), node.id)
            key = (id(scope), node.id)
        else:
            key = id(node)
        if key not in self._cache:
            if key in self._busy:  # defined through itself
                return frozenset()
            self._busy.add(key)
            try:
                self._cache[key] = frozenset(self._tags(node))
            finally:
                self._busy.discard(key)
        return self._cache[key]

    def _union(self, nodes):
        result = set()
        for node in nodes:
            if node is not None:
                result |= self.tags(node)
        return result

    def _tags(self, node):
        if isinstance(node, ast.Name):
            scope = self._resolve(self._scope_of.get(id(node), self.root), node.id)
            return self._union(scope.values.get(node.id, ()))
        if isinstance(node, ast.Call):
            return self._call_tags(node)
        if isinstance(node, ast.BinOp):
            left, right = self.tags(node.left), self.tags(node.right)
            if not isinstance(node.op, _SCALING):
                return left | right
            sums = {t for t in left | right if t[0] == _ACC or t == (_SUM_OP,)}
            result = set(left | right) - sums
            if isinstance(node.op, ast.Div) and (
                sums & left and any(t[0] == _COUNTER for t in right)
            ):
                result.add((_COUNTER_MEAN,))
            return result
        if isinstance(node, ast.Lambda):
            return self.tags(node.body)
        if isinstance(node, (ast.ListComp, ast.SetComp, ast.GeneratorExp)):
            return self.tags(node.elt)
        if isinstance(node, ast.DictComp):
            return self.tags(node.key) | self.tags(node.value)
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            return self._union(node.elts)
        if isinstance(node, ast.Dict):
            return self._union(node.values)
        if isinstance(node, (ast.Subscript, ast.Attribute, ast.Starred, ast.UnaryOp)):
            return self.tags(node.value if not isinstance(node, ast.UnaryOp) else node.operand)
        if isinstance(node, ast.IfExp):
            return self.tags(node.body) | self.tags(node.orelse)
        return set()

    def _call_tags(self, call):
        name = _called_name(call)
        arguments = list(call.args) + [k.value for k in call.keywords]
        if name == "Variable":
            return self._variable_tags(call)
        if name in _STEP_FUNCTIONS:
            return {(_STEP,)}
        if name == "placeholder":
            return {(_PLACEHOLDER,)}
        if name == "assign_add":
            receiver = self._receiver_tags(call)
            if any(t[0] == _ACC for t in receiver):
                return {(_SUM_OP,), (_RERUN,)}
            return set()
        if name in ("assign", "assign_sub", "initialized_value"):
            return set()
        result = self._union(arguments)
        if isinstance(call.func, ast.Attribute):
            result |= self.tags(call.func.value)
        if name in _GRADIENT_FUNCTIONS:
            # The gradients of a loss computed from a placeholder are computed
            # in the graph; only their inputs are fed.
            result.discard((_PLACEHOLDER,))
        return result

    def _variable_tags(self, call):
        position = (call.lineno, call.col_offset)
        keywords = {k.arg: k.value for k in call.keywords}
        initial = _argument(call, 0, "initial_value")
        name = keywords.get("name")
        if isinstance(name, ast.Constant) and name.value == "global_step":
            return {(_STEP,)}
        trainable = keywords.get("trainable")
        if (
            isinstance(trainable, ast.Constant)
            and trainable.value is False
            and initial is not None
            and _calls([initial], {"zeros_like", "zeros"})
        ):
            return {(_ACC, position)}
        if isinstance(initial, ast.Constant) and isinstance(initial.value, float):
            return {(_COUNTER, position)}
        return set()


def _apply_findings(module, call):
    gradients = _argument(call, 0, "grads_and_vars")
    if gradients is None:
        return []
    tags = module.tags(gradients)
    line = gradients.lineno
    rules = []
    if (_SUM_OP,) in tags or any(t in module.summed for t in tags if t[0] == _ACC):
        rules.append("TFA001")
    if (_COUNTER_MEAN,) in tags:
        rules.append("TFA002")
    if (_RERUN,) in tags:
        rules.append("TFA003")
    if (_PLACEHOLDER,) in tags:
        rules.append("TFA004")
    return [(line, rule) for rule in rules]


def _running_average_finding(module, call):
    name = _called_name(call)
    if name != "assign":
        return []
    value = _argument(call, 1 if _function_form(call) else 0, "value")
    if value is None:
        return []
    receiver = module._receiver_tags(call)
    if any(t[0] == _ACC for t in receiver) and (_STEP,) in module.tags(value):
        return [(call.lineno, "TFA005")]
    return []


def _branch_bodies(module, branch):
    if isinstance(branch, ast.Lambda):
        return [branch.body]
    if isinstance(branch, ast.Name):
        return [node for f in module.functions(branch) for node in f.body]
    return []


def _cond_finding(module, call):
    if _called_name(call) != "cond":
        return []
    branches = [
        _argument(call, 1, "true_fn", "fn1"),
        _argument(call, 2, "false_fn", "fn2"),
    ]
    if None in branches:
        return []
    bodies = [_branch_bodies(module, branch) for branch in branches]
    applies = [_calls(body, {"apply_gradients", "minimize"}) for body in bodies]
    accumulates = [_calls(body, {"assign_add"}) for body in bodies]
    if (applies[0] and accumulates[1]) or (applies[1] and accumulates[0]):
        return [(call.lineno, "TFA006")]
    return []


def check_source(source, path="<string>"):
    """Returns the `Finding` list for one module's source text, by line.

    Example:

    >>> source = '''
    ... accum = [tf.Variable(tf.zeros_like(v), trainable=False) for v in tvs]
    ... accum_ops = [a.assign_add(g) for a, (g, v) in zip(accum, gvs)]
    ... train_step = opt.apply_gradients(zip(accum, tvs))
    ... '''
    >>> for finding in check_source(source, "train.py"):
    ...     print(finding.path, finding.line, finding.rule)
    train.py 4 TFA001

    Args:
        source: Python source code, as text.
        path: The name to report the findings under.

    A finding is left out when its line carries the comment
    ``# tf1_accum.check: ignore TFA001`` (several codes: ``TFA001, TFA003``),
    for code that builds a pattern on purpose, a test of it say.

    Returns:
        A list of `Finding`, sorted by line; a file that does not parse gives
        one ``TFA000`` finding at the line of the error.
    """
    try:
        tree = ast.parse(source, filename=path)
    except SyntaxError as error:
        return [
            Finding(
                path,
                error.lineno or 1,
                "TFA000",
                f"cannot parse this file ({error.msg}); fix the syntax, then check it again",
            )
        ]
    except ValueError as error:  # source with a null byte
        return [
            Finding(
                path, 1, "TFA000", f"cannot parse this file ({error}); fix it, then check it again"
            )
        ]
    try:
        found = _findings(tree)
    except RecursionError:
        return [
            Finding(
                path,
                1,
                "TFA000",
                "cannot check this file (its names are chained too deeply to follow); "
                "check it by hand",
            )
        ]
    lines = source.splitlines()
    return [
        Finding(path, line, rule, RULES[rule][1])
        for line, rule in sorted(found)
        if rule not in _ignored(lines[line - 1] if line <= len(lines) else "")
    ]


_IGNORE = re.compile(r"#\s*tf1_accum\.check:\s*ignore\s+(TFA\d{3}(?:\s*,\s*TFA\d{3})*)")


def _ignored(line):
    """The rules a ``# tf1_accum.check: ignore TFA001, ...`` comment turns off."""
    match = _IGNORE.search(line)
    return set(re.split(r"\s*,\s*", match.group(1))) if match else set()


def _findings(tree):
    """The (line, rule) pairs found in a parsed module."""
    module = _Module(tree)
    found = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        name = _called_name(node)
        if name == "apply_gradients":
            found.update(_apply_findings(module, node))
        elif name == "initialized_value":
            found.add((node.lineno, "TFA007"))
        found.update(_running_average_finding(module, node))
        found.update(_cond_finding(module, node))
    return found


def python_files(paths):
    """Yields the files to check: each file given, and the *.py under each directory.

    Raises:
        FileNotFoundError: If a path does not exist.
    """
    for path in paths:
        if os.path.isdir(path):
            for root, dirs, files in os.walk(path):
                dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d != "__pycache__")
                for name in sorted(files):
                    if name.endswith(".py"):
                        yield os.path.join(root, name)
        elif os.path.exists(path):
            yield path
        else:
            raise FileNotFoundError(f"no such file or directory: {path}")


def check_paths(paths):
    """Returns the findings in the files and directories ``paths``, file by file.

    Args:
        paths: Files (checked whatever their name) and directories (walked for
            ``*.py``, skipping hidden directories and ``__pycache__``).

    Returns:
        A list of `Finding`. A file that cannot be read as UTF-8 gives one
        ``TFA000`` finding.

    Raises:
        FileNotFoundError: If a path does not exist.
    """
    findings = []
    for path in python_files(paths):
        try:
            with open(path, encoding="utf-8") as file:
                source = file.read()
        except (OSError, UnicodeDecodeError) as error:
            findings.append(
                Finding(path, 1, "TFA000", f"cannot read this file ({error}); check it by hand")
            )
            continue
        findings.extend(check_source(source, path))
    return findings
