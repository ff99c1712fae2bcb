"""A thin asyncio client for containerd's CRI (RuntimeService and ImageService over gRPC).

The agent speaks to containers only through this. Requests and replies are the
generated protobuf messages themselves (`api.PodSandboxConfig`, ...); this module adds
only what every call needs: one channel on the unix socket, a deadline per call, and one
exception type (`CriError`) that keeps gRPC's code and containerd's message, because the
agent matches that text (`no space left on device`, `not found`, ...) as a kubelet does.

    runtime = Runtime("/run/node/containerd.sock")
    await runtime.wait_ready(timeout=10)
    sandbox_id = (await runtime.run_pod_sandbox(api.RunPodSandboxRequest(config=config))).pod_sandbox_id
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import grpc
import grpc.aio

from socialweb_computer.node.cri.generated import api_pb2 as api
from socialweb_computer.node.cri.generated import api_pb2_grpc as api_grpc

# Long calls: pulls and stops carry their own deadlines; everything else is sub-second here.
DEFAULT_TIMEOUT = 30.0
PULL_TIMEOUT = 15 * 60.0


class CriError(Exception):
    """A CRI call failed: `code` is gRPC's status code, `message` containerd's text."""

    def __init__(self, method: str, code: grpc.StatusCode, message: str) -> None:
        super().__init__(f"{method}: {message}")
        self.method = method
        self.code = code
        self.message = message

    @property
    def not_found(self) -> bool:
        return self.code == grpc.StatusCode.NOT_FOUND or "not found" in self.message


class Runtime:
    def __init__(self, socket_path: str) -> None:
        self.socket_path = socket_path
        # Large images' status and exec output can exceed gRPC's 4 MiB default.
        self._channel = grpc.aio.insecure_channel(
            f"unix:{socket_path}", options=[("grpc.max_receive_message_length", 64 << 20)]
        )
        self._runtime = api_grpc.RuntimeServiceStub(self._channel)
        self._images = api_grpc.ImageServiceStub(self._channel)

    async def close(self) -> None:
        await self._channel.close()

    async def _call(self, stub: Any, method: str, request: Any, timeout: float = DEFAULT_TIMEOUT) -> Any:
        try:
            return await getattr(stub, method)(request, timeout=timeout)
        except grpc.aio.AioRpcError as exc:
            raise CriError(method, exc.code(), exc.details() or "") from None

    async def wait_ready(self, *, timeout: float) -> api.VersionResponse:
        """Polls Version until containerd answers (it listens about a second after start)."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                return await self._call(self._runtime, "Version", api.VersionRequest(), timeout=1.0)
            except CriError:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.05)

    # ---------------------------------------------------------------- runtime

    async def version(self) -> api.VersionResponse:
        return await self._call(self._runtime, "Version", api.VersionRequest())

    async def status(self) -> api.StatusResponse:
        return await self._call(self._runtime, "Status", api.StatusRequest())

    async def run_pod_sandbox(self, config: api.PodSandboxConfig) -> str:
        reply = await self._call(
            self._runtime, "RunPodSandbox", api.RunPodSandboxRequest(config=config), timeout=2 * 60.0
        )
        return reply.pod_sandbox_id

    async def stop_pod_sandbox(self, sandbox_id: str) -> None:
        await self._call(
            self._runtime,
            "StopPodSandbox",
            api.StopPodSandboxRequest(pod_sandbox_id=sandbox_id),
            timeout=2 * 60.0,
        )

    async def remove_pod_sandbox(self, sandbox_id: str) -> None:
        await self._call(
            self._runtime,
            "RemovePodSandbox",
            api.RemovePodSandboxRequest(pod_sandbox_id=sandbox_id),
            timeout=2 * 60.0,
        )

    async def pod_sandbox_status(self, sandbox_id: str) -> api.PodSandboxStatus:
        reply = await self._call(
            self._runtime, "PodSandboxStatus", api.PodSandboxStatusRequest(pod_sandbox_id=sandbox_id)
        )
        return reply.status

    async def list_pod_sandboxes(self, labels: dict[str, str] | None = None) -> list[api.PodSandbox]:
        request = api.ListPodSandboxRequest(filter=api.PodSandboxFilter(label_selector=labels or {}))
        return list((await self._call(self._runtime, "ListPodSandbox", request)).items)

    async def create_container(
        self, sandbox_id: str, config: api.ContainerConfig, sandbox_config: api.PodSandboxConfig
    ) -> str:
        reply = await self._call(
            self._runtime,
            "CreateContainer",
            api.CreateContainerRequest(
                pod_sandbox_id=sandbox_id, config=config, sandbox_config=sandbox_config
            ),
            timeout=2 * 60.0,
        )
        return reply.container_id

    async def start_container(self, container_id: str) -> None:
        await self._call(
            self._runtime,
            "StartContainer",
            api.StartContainerRequest(container_id=container_id),
            timeout=2 * 60.0,
        )

    async def stop_container(self, container_id: str, grace_seconds: int) -> None:
        """SIGTERM (or the image's stop signal), SIGKILL after `grace_seconds`."""
        await self._call(
            self._runtime,
            "StopContainer",
            api.StopContainerRequest(container_id=container_id, timeout=grace_seconds),
            timeout=grace_seconds + 30.0,
        )

    async def remove_container(self, container_id: str) -> None:
        await self._call(
            self._runtime, "RemoveContainer", api.RemoveContainerRequest(container_id=container_id)
        )

    async def list_containers(self, labels: dict[str, str] | None = None) -> list[api.Container]:
        request = api.ListContainersRequest(filter=api.ContainerFilter(label_selector=labels or {}))
        return list((await self._call(self._runtime, "ListContainers", request)).containers)

    async def container_status(self, container_id: str) -> api.ContainerStatus:
        reply = await self._call(
            self._runtime, "ContainerStatus", api.ContainerStatusRequest(container_id=container_id)
        )
        return reply.status

    async def exec_sync(self, container_id: str, command: list[str], timeout: float) -> api.ExecSyncResponse:
        request = api.ExecSyncRequest(container_id=container_id, cmd=command, timeout=max(1, int(timeout)))
        return await self._call(self._runtime, "ExecSync", request, timeout=timeout + 10.0)

    async def exec_url(self, request: api.ExecRequest) -> str:
        return (await self._call(self._runtime, "Exec", request)).url

    async def attach_url(self, request: api.AttachRequest) -> str:
        return (await self._call(self._runtime, "Attach", request)).url

    async def port_forward_url(self, request: api.PortForwardRequest) -> str:
        return (await self._call(self._runtime, "PortForward", request)).url

    async def reopen_container_log(self, container_id: str) -> None:
        await self._call(
            self._runtime, "ReopenContainerLog", api.ReopenContainerLogRequest(container_id=container_id)
        )

    async def list_container_stats(self) -> list[api.ContainerStats]:
        return list(
            (await self._call(self._runtime, "ListContainerStats", api.ListContainerStatsRequest())).stats
        )

    # ---------------------------------------------------------------- images

    async def pull_image(
        self, image: str, auth: api.AuthConfig | None, sandbox_config: api.PodSandboxConfig | None = None
    ) -> str:
        request = api.PullImageRequest(
            image=api.ImageSpec(image=image), auth=auth, sandbox_config=sandbox_config
        )
        return (await self._call(self._images, "PullImage", request, timeout=PULL_TIMEOUT)).image_ref

    async def image_status(self, image: str) -> api.Image | None:
        """The image when present, else None."""
        reply = await self._call(
            self._images, "ImageStatus", api.ImageStatusRequest(image=api.ImageSpec(image=image))
        )
        return reply.image if reply.HasField("image") else None

    async def list_images(self) -> list[api.Image]:
        return list((await self._call(self._images, "ListImages", api.ListImagesRequest())).images)

    async def remove_image(self, image: str) -> None:
        await self._call(
            self._images, "RemoveImage", api.RemoveImageRequest(image=api.ImageSpec(image=image))
        )

    async def image_fs_info(self) -> api.ImageFsInfoResponse:
        return await self._call(self._images, "ImageFsInfo", api.ImageFsInfoRequest())
