"""The process-wide managers built from ``settings.REDLOCK``: :func:`get_manager` and
:func:`get_async_manager`, made on first use and dropped when the setting changes.

:func:`set_manager_factory` is the one hook between the settings and how the manager is
built: ``AppConfig.ready`` installs :func:`django_redlock.signals.observed_manager`, whose
managers send the lock signals and count the metrics; without the app installed, managers are
plain (:func:`build_manager`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from django.core.exceptions import ImproperlyConfigured

from django_redlock import conf
from django_redlock.conf import RedlockSettings
from django_redlock.redlock import LockManager

if TYPE_CHECKING:
    from django_redlock.aredlock import AsyncLockManager

__all__ = [
    "ManagerFactory",
    "build_manager",
    "get_async_manager",
    "get_manager",
    "reset",
    "set_manager_factory",
]

ManagerFactory = Callable[[RedlockSettings], LockManager]
"""Builds the process-wide manager from the parsed settings (see :func:`set_manager_factory`)."""


def build_manager(config: RedlockSettings, **options: Any) -> LockManager:
    """A :class:`~django_redlock.LockManager` from parsed settings; ``options`` are more of its
    arguments (its ``observer``, say). The default :data:`ManagerFactory`.

    Raises:
        TypeError, ValueError: as ``LockManager``.
    """
    return LockManager(**config.manager_options(), **options)


_manager: LockManager | None = None
_async_manager: AsyncLockManager | None = None
_manager_factory: ManagerFactory = build_manager


def set_manager_factory(factory: ManagerFactory) -> None:
    """Set how :func:`get_manager` builds the manager, and drop the current one."""
    global _manager_factory
    _manager_factory = factory
    reset()


def get_manager() -> LockManager:
    """The process-wide :class:`~django_redlock.LockManager` built from ``settings.REDLOCK``.

    Raises:
        ImproperlyConfigured: the setting is missing or invalid (the message names the part
            and the system check id).
    """
    global _manager
    if _manager is None:
        config = conf.get_settings()
        try:
            _manager = _manager_factory(config)
        except (TypeError, ValueError) as exc:
            raise ImproperlyConfigured(f"REDLOCK: {exc}") from None
    return _manager


def get_async_manager() -> AsyncLockManager:
    """The process-wide :class:`~django_redlock.aredlock.AsyncLockManager`, built from the
    same settings (and observer) as :func:`get_manager`; its connections are per event loop.

    Raises:
        ImproperlyConfigured: as :func:`get_manager`.
    """
    global _async_manager
    manager = get_manager()
    if _async_manager is None or _async_manager.engine is not manager.engine:
        from django_redlock.aredlock import AsyncLockManager  # its import costs asyncio

        _async_manager = AsyncLockManager.sharing(manager)
    return _async_manager


def reset(**kwargs: object) -> None:
    """Drop the parsed settings and the managers (the ``setting_changed`` receiver)."""
    global _manager, _async_manager
    if kwargs.get("setting", "REDLOCK") not in ("REDLOCK", "CACHES"):
        return
    if _manager is not None:
        _manager.close()
    conf.forget_settings()
    _manager = None
    _async_manager = None
